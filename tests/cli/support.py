"""Shared set-up of the engine-directory tests: homes with a live log, git, staged edits."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

from pulse_cli import config as config_file
from pulse_cli.assembly import build_engine, load_code
from pulse_cli.enginedir import init_engine_dir
from pulse_cli.loader import EngineCode, load_engine_code
from pulse_core import (
    Decision,
    EventDraft,
    Sample,
    Snapshot,
    SqliteEventStore,
    VitalReading,
    VitalsStore,
)

ROOT = Path(__file__).resolve().parents[2]
RULE = Path("rules") / "inbox.py"
TEST = Path("tests") / "test_examples.py"
OLD_TEXT = "message(s) waiting in the inbox"
NEW_TEXT = "new message(s) are waiting"


def git(repo: Path, *args: str) -> str:
    """Test-side git, for looking at (and setting up) a repository."""
    done = subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@localhost",
                           *args], cwd=repo, capture_output=True, text=True, check=True,
                          timeout=30)
    return done.stdout.strip()


async def make_home(home: Path) -> Path:
    """An initialised home with a live log (two events), an inbox vital of 3 messages, and
    3 messages in HOME/inbox (what the engine directory's watcher counts)."""
    assert await asyncio.to_thread(init_engine_dir, home)
    events = await SqliteEventStore.open(home / "events.db")
    await events.append([EventDraft("engine-started", "engine", {"pid": n, "owner": "t"},
                                    origin="engine") for n in (1, 2)])
    await events.close()
    vitals = await VitalsStore.open(home / "vitals.db")
    await vitals.record("inbox", {"count": 3})
    await vitals.close()
    (home / "inbox").mkdir()
    for n in range(3):
        (home / "inbox" / f"message-{n}.txt").write_text("hello")
    return home


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text(encoding="utf-8")
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new), encoding="utf-8")


def stage_new_text(staging: Path) -> None:
    """A good edit: the rule's note (and its test) say NEW_TEXT."""
    edit(staging / RULE, f'f"{{count}} {OLD_TEXT}"', f'f"{{count}} {NEW_TEXT}"')
    edit(staging / TEST, f'"3 {OLD_TEXT}"', f'"3 {NEW_TEXT}"')


async def promote_without_gate(home: Path, events: SqliteEventStore) -> str:
    """What promote does once the gate passed, done by hand (the gate is tested elsewhere)."""
    staging = home / "staging"
    git(staging, "add", "-A")
    if git(staging, "status", "--porcelain"):
        git(staging, "commit", "-q", "-m", "staged by the test")
    previous = git(home / "engine", "rev-parse", "HEAD")
    git(home / "engine", "merge", "-q", "--no-edit", "staging")
    now = git(home / "engine", "rev-parse", "HEAD")
    await events.append([promote_event(now, previous)])
    return now


def promote_event(revision: str, previous: str) -> EventDraft:
    """The `promote` event promote records (before main moves) for `revision`."""
    return EventDraft("promote", "engine-directory",
                      {"revision": revision, "previous": previous}, origin="cli")


async def note_of(engine_dir: Path) -> str:
    """The note the engine directory's first rule writes when the inbox grows from 0 to 3."""
    return await first_note(load_engine_code(engine_dir))


async def first_note(code: EngineCode) -> str:
    """The note `code`'s first rule writes when the inbox grows from 0 to 3."""
    async def inside(prev: Snapshot, curr: Snapshot) -> Decision:
        return Decision([], 1_000)

    def seen(count: int) -> Snapshot:
        sample = Sample("inbox", 0, {"count": count})
        return Snapshot(seq=1, at=0, number=1, vitals={"inbox": VitalReading(sample, 0)},
                        projections={})

    rule = __import__(f"{code.package}.rules.inbox", fromlist=["inbox_note"]).inbox_note
    effects, _ = await rule(seen(0), seen(3), inside)
    text = getattr(effects[0], "text", None)
    assert isinstance(text, str)
    return text


def child_env() -> dict[str, str]:
    """The environment of a child python that imports pulse from this checkout."""
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONDONTWRITEBYTECODE": "1"}


def configure(home: Path, **fields: object) -> None:
    """Set top-level fields of HOME/config.json (the rest is kept)."""
    path = home / "config.json"
    config = json.loads(path.read_text())
    config.update(fields)
    path.write_text(json.dumps(config))


PROBE_LAYER = '''"""probe: a third-party layer for the CLI tests, found through its entry point."""

from __future__ import annotations

from typing import Any

import msgspec

from pulse_core import Decision, Inner, Layer, LayerContext, Snapshot, Watcher


class ProbeSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tag: str
    interval_s: float = 0.2


class ProbeWatcher(Watcher):
    """Reports the tag config.json gave the layer, as vitals key `probe`."""

    name = "probe"

    def __init__(self, tag: str, interval: float) -> None:
        super().__init__()
        self.tag = tag
        self.interval = interval

    async def collect(self) -> dict[str, str]:
        return {"tag": self.tag}


async def probe_passes(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    return await inner(prev, curr)


def layer(settings: Any, context: LayerContext) -> Layer:
    config = msgspec.convert(settings, ProbeSettings)
    return Layer("probe", watchers=[ProbeWatcher(config.tag, config.interval_s)],
                 rules=[probe_passes])
'''


def install_probe_layer(site: Path) -> Path:
    """A distribution in `site` (put it on the path) whose entry point in `pulse.layers` is
    the layer `probe`: settings {"tag": str}, a watcher that reports the tag, one rule."""
    info = site / "pulse_probe_layer-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pulse-probe-layer\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text("[pulse.layers]\nprobe = pulse_probe_layer:layer\n")
    (site / "pulse_probe_layer.py").write_text(PROBE_LAYER)
    return site


async def run_ticks(home: Path, arrivals: list[int]) -> None:
    """The engine the daemon would build for `home` ticks once per entry of `arrivals`,
    after that many new messages reached the inbox."""
    code = await asyncio.to_thread(load_code, home / "engine")
    engine = build_engine(home, config_file.load_or_default(home / "config.json"), code)
    await engine.open()
    try:
        for arrived in arrivals:
            start = len(list((home / "inbox").iterdir()))
            for n in range(arrived):
                (home / "inbox" / f"message-{start + n}.txt").write_text("hello")
            await engine.step()
    finally:
        await engine.close()
        code.forget()
