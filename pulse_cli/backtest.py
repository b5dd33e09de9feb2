"""The promote gate's backtest: the staged engine run over the last recorded ticks, and how
the effects it decides differ from the ones recorded.

Every tick that wrote something kept a record (pulse_core.TickRecord); the backtest replays
the last `ticks` of them with the staged chain (pulse_cli.replay.replay_ticks) on the gate's
scratch copy of the log, reading the records from the live home's objects/ (read-only), in a
child process (`python -m pulse_cli.backtest ...`) like the dry run: the staged modules never
enter the caller's process, and a chain that hangs is killed at the step's deadline. With
`max_diff` set, a diff of more effects than that fails the step and refuses the promote.
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from pulse_cli import config as config_file
from pulse_cli.dryrun import copy_live_home
from pulse_cli.home import Home
from pulse_core import HomeLayout, ObjectStore, PulseError, last_recorded, open_home

if TYPE_CHECKING:  # replay builds on the engine directory, whose gate runs this
    from pulse_cli.replay import TickReplay

BACKTEST_TICKS = 100
"""How many recorded ticks the gate replays by default."""
SHOWN = 5
"""How many differing ticks (and errors) a backtest names."""
RESULT = "backtest.json"

ChildRunner = Callable[[list[str], Path, Mapping[str, str], float],
                       Awaitable[tuple[int | None, str]]]
"""Runs a child (argv, cwd, extra env, limit in s): its exit code (None: killed at the limit)
and what it printed."""


class KindCounts(msgspec.Struct, frozen=True):
    """Effects of one kind over the backtest, by how they compare."""

    same: int = 0
    changed: int = 0
    missing: int = 0
    extra: int = 0


class DifferingTick(msgspec.Struct, frozen=True):
    """A replayed tick whose effects differ: how many changed, are missing, are extra."""

    tick: int
    seq: int
    changed: int
    missing: int
    extra: int


class Backtest(msgspec.Struct, frozen=True):
    """What the staged engine would have decided over `ticks` recorded ticks: `differs`
    effects differ over `differing` ticks; `kinds` counts by effect kind; `first` names the
    first differing ticks (SHOWN at most); `errors` the first errors staged rules raised."""

    ticks: int = 0
    differing: int = 0
    differs: int = 0
    kinds: dict[str, KindCounts] = {}
    first: tuple[DifferingTick, ...] = ()
    errors: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        """The backtest as the gate prints it."""
        if not self.ticks:
            return ["no recorded ticks to backtest (only ticks that write keep a record): "
                    "passes"]
        said = [f"{self.ticks} recorded tick(s) replayed with the staged code: "
                f"{self.differing} differ, {self.differs} effect(s) differ"]
        for kind, c in sorted(self.kinds.items()):
            said.append(f"  {kind}: {c.same} same, {c.changed} changed, {c.missing} missing, "
                        f"{c.extra} extra")
        said += [f"  tick {t.tick} (event #{t.seq}): {t.changed} changed, {t.missing} "
                 f"missing, {t.extra} extra — `upulse replay {t.tick} --staged` shows it"
                 for t in self.first]
        said += [f"  error: {e}" for e in self.errors]
        return said


def summarise(replays: Sequence[TickReplay]) -> Backtest:
    """The Backtest of `replays` (oldest first)."""
    kinds: dict[str, dict[str, int]] = {}
    first: list[DifferingTick] = []
    errors: list[str] = []
    differing = differs = 0
    for done in replays:
        diff = done.diff
        for side, effects in (("same", diff.same), ("missing", diff.missing),
                              ("extra", diff.extra), ("changed", [a for a, _ in diff.changed])):
            for effect in effects:
                counts = kinds.setdefault(effect.kind, {})
                counts[side] = counts.get(side, 0) + 1
        errors += [f"tick {done.tick.record.number}: {e}" for e in done.replayed.errors]
        if diff.differs:
            differing += 1
            differs += diff.differs
            if len(first) < SHOWN:
                first.append(DifferingTick(done.tick.record.number, done.tick.seq,
                                           len(diff.changed), len(diff.missing),
                                           len(diff.extra)))
    return Backtest(len(replays), differing, differs,
                    {k: KindCounts(**v) for k, v in kinds.items()}, tuple(first),
                    tuple(errors[:SHOWN]))


def verdict(backtest: Backtest, max_diff: int | None) -> tuple[bool, str]:
    """Whether the backtest passes the bound `max_diff` (None: any diff passes), and what
    the gate says."""
    said = "\n".join(backtest.lines())
    if max_diff is not None and backtest.differs > max_diff:
        return False, (f"{said}\nthe staged code would have decided {backtest.differs} "
                       f"effect(s) otherwise over the last {backtest.ticks} recorded tick(s), "
                       f"more than --max-diff {max_diff} allows — look at the ticks above "
                       "with `upulse replay TICK --staged`, then fix staging or raise the bound")
    return True, said


async def run_backtest(staging: Path, home: Path, *, ticks: int, max_diff: int | None,
                       limit_s: float, run: ChildRunner, python: Sequence[str],
                       env: Mapping[str, str]) -> tuple[bool, str, Backtest | None]:
    """The gate's backtest step: the staged code in `staging` over the last `ticks` records
    of the live home `home`, on a scratch copy of its log (pulse_cli.dryrun.copy_live_home)
    with the records read from its objects/, in a child `run` starts with `python` and
    `env`; (passed, what it says, the backtest when it ran)."""
    if ticks <= 0:
        return True, "no backtest (asked for over 0 ticks)", None
    live = Home(home)
    with tempfile.TemporaryDirectory(prefix="upulse-backtest-") as tmp:
        scratch, out = Path(tmp) / "home", Path(tmp) / RESULT
        scratch.mkdir()
        await asyncio.to_thread(copy_live_home, live, HomeLayout(scratch))
        code, said = await run(
            [*python, "-m", "pulse_cli.backtest", str(staging), str(scratch),
             str(live.layout.objects), str(ticks), str(out)], Path(tmp), env, limit_s)
        if code is None:
            return False, f"the backtest did not finish within {limit_s:g} s (killed)", None
        try:
            backtest = msgspec.json.decode(out.read_bytes(), type=Backtest)
        except (OSError, msgspec.DecodeError):
            return False, f"the backtest failed:\n{said}", None
    ok, message = verdict(backtest, max_diff)
    return ok, message, backtest


async def _backtest(engine_dir: Path, scratch: Path, objects: Path, count: int) -> Backtest:
    from pulse_cli.assembly import build_engine, load_code  # the child's
    from pulse_cli.replay import replay_ticks

    cfg = config_file.on_scratch(config_file.load_or_default(Home(scratch).config))
    code = load_code(engine_dir, staged=True)
    stores = await open_home(scratch, read_only=True)
    try:
        recorded = await last_recorded(stores.events, ObjectStore(objects, read_only=True),
                                       count)
        if not recorded:
            return Backtest()
        with tempfile.TemporaryDirectory(prefix="upulse-backtest-engine-") as tmp:
            engine = build_engine(Path(tmp), cfg, code)
            return summarise(await replay_ticks(engine, stores.events, recorded))
    finally:
        await stores.close()


def _child(argv: list[str]) -> int:
    if len(argv) != 5:
        print("usage: python -m pulse_cli.backtest ENGINE_DIR SCRATCH_HOME OBJECTS TICKS OUT",
              file=sys.stderr)
        return 2
    engine_dir, scratch, objects, count, out = argv
    try:
        backtest = asyncio.run(_backtest(Path(engine_dir), Path(scratch), Path(objects),
                                         int(count)))
    except (PulseError, OSError) as exc:
        print(f"{type(exc).__name__}: {exc}", flush=True)
        return 1
    Path(out).write_bytes(msgspec.json.encode(backtest))
    print(json.dumps({"ticks": backtest.ticks, "differs": backtest.differs}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
