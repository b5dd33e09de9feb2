"""Tick records and `upulse replay`: a tick that wrote something is kept and runs again, on
the snapshot it saw, to the same effects; a tick that wrote nothing keeps nothing."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path

import msgspec
import pytest

from pulse_cli.home import Home
from pulse_cli.replay import EXIT_DIFFERS, RevisionNotFound, replay
from pulse_core import (
    RecordedEffect,
    TickNotFound,
    TickNotRecorded,
    diff_effects,
    find_tick,
    open_home,
)
from tests.cli.runner import Upulse
from tests.cli.support import NEW_TEXT, OLD_TEXT, git, make_home, run_ticks, stage_new_text


@pytest.fixture(scope="module")
def ticked(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A home whose engine ran three ticks: the first saw 3 messages (a Note), the second
    nothing new (nothing written), the third 2 more (a Note)."""
    home = tmp_path_factory.mktemp("replay") / "home"

    async def run() -> Path:
        await make_home(home)
        await run_ticks(home, [0, 0, 2])
        return home

    return asyncio.run(run())


def _digest(home: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(home.iterdir()) if p.is_file()}


async def test_a_tick_that_wrote_keeps_its_record_and_one_that_wrote_nothing_keeps_none(
        ticked: Path) -> None:
    stores = await open_home(ticked, read_only=True)
    try:
        ticks = await stores.events.read(kinds=["tick"])
        assert [t.data["number"] for t in ticks] == [1, 3]
        assert all(t.hash is not None for t in ticks)
        first = await find_tick(stores.events, stores.objects, 1)
        assert first.record.revision == git(ticked / "engine", "rev-parse", "HEAD")
        assert [(e.kind, e.payload["text"]) for e in first.record.effects] == [
            ("note", f"3 {OLD_TEXT}")]
        assert first.record.curr.vitals["inbox"].sample.data == {"count": 3}
        assert [t.rule for t in first.record.trace][-1] == "inbox_note"
        with pytest.raises(TickNotRecorded, match="tick 2 wrote nothing"):
            await find_tick(stores.events, stores.objects, 2)
        with pytest.raises(TickNotFound, match=r"no tick 4 ran on this home \(ticks 1 to 3"):
            await find_tick(stores.events, stores.objects, 4,
                            checkpoints=ticked / "checkpoints")
        objects = [p for p in (ticked / "objects").rglob("*") if p.is_file()]
        assert len(objects) == 2
    finally:
        await stores.close()


def test_upulse_replay_reproduces_the_recorded_effects_and_writes_nothing(
        ticked: Path, upulse: Upulse) -> None:
    before = _digest(ticked)
    for tick, count in ((1, 3), (3, 5)):
        report = upulse.json("replay", str(tick), "--home", ticked)
        assert isinstance(report, dict)
        assert report["differs"] == 0, report
        assert [e["payload"]["text"] for e in report["diff"]["same"]] == [
            f"{count} {OLD_TEXT}"]
        assert report["revision"] == report["recorded_revision"]
        assert report["tick_ms"]["recorded"] == report["tick_ms"]["replayed"]
        assert all(r["recorded"] == r["replayed"] for r in report["rules"])
    shown = upulse("replay", "3", "--verbose", "--home", ticked).stdout
    assert "1 same, 0 changed, 0 missing, 0 extra" in shown
    assert "inbox_note" in shown and "RECORDED" in shown and "REPLAYED" in shown
    assert _digest(ticked) == before


def test_upulse_replay_names_a_tick_it_cannot_replay(ticked: Path, upulse: Upulse) -> None:
    nothing = upulse("replay", "2", "--home", ticked, ok=False)
    assert nothing.returncode == 1
    assert "TickNotRecorded" in nothing.stderr or "wrote nothing" in nothing.stderr
    unknown = upulse("replay", "9", "--home", ticked, ok=False)
    assert unknown.returncode == 1 and "no tick 9 ran on this home" in unknown.stderr


async def test_replaying_another_revision_shows_what_it_would_have_done(
        ticked: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = Home(ticked)
    with pytest.raises(RevisionNotFound, match="'no-such-rev' is not a commit"):
        await replay(home, 1, revision="no-such-rev")
    stage_new_text(ticked / "staging")
    try:
        capsys.readouterr()
        assert await replay(home, 3, staged=True, as_json=True) == EXIT_DIFFERS == 3
        report = json.loads(capsys.readouterr().out)
        assert report["revision"] == "staging"
        assert report["diff"]["same"] == [] and report["differs"] == 1
        (changed,) = report["diff"]["changed"]
        assert changed["recorded"]["payload"]["text"] == f"5 {OLD_TEXT}"
        assert changed["replayed"]["payload"]["text"] == f"5 {NEW_TEXT}"
        git(ticked / "staging", "commit", "-q", "-am", "the new text")
        staged = git(ticked / "staging", "rev-parse", "HEAD")
        assert await replay(home, 1, revision=staged) == EXIT_DIFFERS
        assert "1 changed" in capsys.readouterr().out
    finally:
        git(ticked / "staging", "reset", "-q", "--hard", "main")


def test_the_diff_pairs_effects_by_kind_and_key_then_by_kind() -> None:
    def note(text: str, key: str = "") -> RecordedEffect:
        return RecordedEffect("note", key or f"note:{text}", {"type": "note", "text": text})

    ping = RecordedEffect("ping", "ping:1", {"type": "ping"})
    other = RecordedEffect("ping", "k", {"type": "ping", "of": "another kind, the same key"})
    diff = diff_effects([note("a"), note("b", "k"), note("c"), ping],
                        [other, note("x", "k"), note("a"), note("d")])
    assert diff.same == (note("a"),)
    assert diff.changed == ((note("b", "k"), note("x", "k")), (note("c"), note("d")),
                            (ping, other))
    assert diff.missing == () and diff.extra == ()
    assert diff.differs == 3
    assert diff_effects([ping], [note("a")]).missing == (ping,)
    assert msgspec.json.decode(msgspec.json.encode(diff), type=type(diff)) == diff
