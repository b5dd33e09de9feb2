"""`upulse replay TICK`: run a recorded tick again and compare what it decides with what it
decided then.

A tick that wrote something keeps a record (pulse_core.TickRecord: its snapshots' vitals and
log positions, the revision that ran it, its effects and rule trace). Replay opens the home
read-only, loads the record, builds the chain of that revision (the engine directory's
commit, read from git; or `--revision R`, or `--staged`) the way the daemon builds its
engine, folds that chain's projections over the log up to the recorded positions, runs the
chain once on the recorded snapshots and diffs the effects. Nothing is written to the home.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from pulse_cli import config as config_file
from pulse_cli.assembly import build_engine, load_code
from pulse_cli.enginedir import EngineDirError
from pulse_cli.git import git
from pulse_cli.home import EXIT_STATE, Home
from pulse_cli.loader import EngineCode
from pulse_cli.output import print_json, print_table, to_json
from pulse_cli.stores import opened
from pulse_core import (
    EffectDiff,
    Engine,
    EventStore,
    LogFold,
    RecordedEffect,
    RecordedTick,
    Replayed,
    RuleTrace,
    diff_effects,
    find_tick,
    replay_tick,
)

EXIT_DIFFERS = EXIT_STATE
"""What `upulse replay` exits with when the effects differ: the check does not hold (as
`upulse maintenance health` does), not an error."""


class RevisionNotFound(EngineDirError):
    """The revision a replay should run is not a commit of the home's engine directory."""


class TickReplay(msgspec.Struct, frozen=True):
    """One recorded tick run again: the record, what the chain decided now, the diff."""

    tick: RecordedTick
    replayed: Replayed
    diff: EffectDiff


async def replay_ticks(engine: Engine, events: EventStore,
                       ticks: Sequence[RecordedTick]) -> list[TickReplay]:
    """Run `engine`'s chain (the engine is built, never opened) on each of `ticks`, oldest
    first, with its projections folded over `events` up to each record."""
    fold = LogFold(events, engine.projection_list)
    done: list[TickReplay] = []
    for tick in sorted(ticks, key=lambda t: t.seq):
        replayed = await replay_tick(engine.chain, fold, tick.record)
        done.append(TickReplay(tick, replayed, diff_effects(tick.record.effects,
                                                            replayed.effects)))
    return done


async def resolve_revision(engine_dir: Path, revision: str) -> str:
    """The full commit `revision` names in `engine_dir`; RevisionNotFound otherwise."""
    found = ""
    if await asyncio.to_thread(engine_dir.is_dir):
        found = await git(engine_dir, "rev-parse", "--verify", "--quiet",
                          f"{revision}^{{commit}}", check=False)
    if not found:
        raise RevisionNotFound(
            f"revision {revision!r} is not a commit of {engine_dir} — `git -C {engine_dir} log "
            "--oneline --all` lists them (a rolled-back revision is kept on a rolled-back/ "
            "branch)")
    return found


async def _code(home: Home, recorded: str | None, revision: str | None,
                staged: bool) -> EngineCode:
    if staged:
        return await asyncio.to_thread(load_code, home.staging, staged=True)
    wanted = revision or recorded
    if wanted is None:  # the tick ran without an engine directory: what runs now
        return await asyncio.to_thread(load_code, home.engine)
    full = await resolve_revision(home.engine, wanted)
    return await asyncio.to_thread(load_code, home.engine, revision=full)


async def replay(home: Home, tick: int, *, revision: str | None = None, staged: bool = False,
                 verbose: bool = False, as_json: bool = False) -> int:
    """Replay tick `tick` of `home` (see the module); exit 0 when the effects are the same,
    EXIT_DIFFERS when not. TickNotFound, TickNotRecorded and RevisionNotFound say why a
    tick cannot be replayed."""
    cfg = config_file.on_scratch(config_file.load_or_default(home.readable().config))
    async with opened(home, read_only=True) as stores:
        found = await find_tick(stores.events, stores.objects, tick,
                                checkpoints=home.layout.checkpoints)
        code = await _code(home, found.record.revision, revision, staged)
        try:
            with tempfile.TemporaryDirectory(prefix="upulse-replay-") as tmp:
                engine = build_engine(Path(tmp), cfg, code)
                (done,) = await replay_ticks(engine, stores.events, [found])
        finally:
            code.forget()
    ran = "staging" if staged else (code.revision or "no engine directory")
    if as_json:
        print_json(_report(done, ran))
    else:
        _print(done, ran, verbose=verbose)
    return 0 if done.diff.differs == 0 else EXIT_DIFFERS


def _effect(effect: RecordedEffect) -> dict[str, Any]:
    return msgspec.to_builtins(effect)  # type: ignore[no-any-return]


def _traces(recorded: Sequence[RuleTrace], replayed: Sequence[RuleTrace]
            ) -> list[tuple[str, str, RuleTrace | None, RuleTrace | None]]:
    """(rule, tier, recorded, replayed) for every rule of either trace, in chain order."""
    then = {t.rule: t for t in recorded}
    now = {t.rule: t for t in replayed}
    order = [t.rule for t in replayed] + [t.rule for t in recorded if t.rule not in now]
    return [(rule, (now.get(rule) or then[rule]).tier, then.get(rule), now.get(rule))
            for rule in order]


def diff_report(diff: EffectDiff) -> dict[str, Any]:
    """A diff as JSON gives it: counts, and each effect by its side."""
    return {"same": [_effect(e) for e in diff.same],
            "changed": [{"recorded": _effect(a), "replayed": _effect(b)}
                        for a, b in diff.changed],
            "missing": [_effect(e) for e in diff.missing],
            "extra": [_effect(e) for e in diff.extra]}


def _report(done: TickReplay, ran: str) -> dict[str, Any]:
    record = done.tick.record
    return {
        "tick": record.number, "seq": done.tick.seq, "record": done.tick.digest,
        "snapshot_seq": record.curr.seq, "recorded_revision": record.revision,
        "revision": ran, "differs": done.diff.differs, "diff": diff_report(done.diff),
        "tick_ms": {"recorded": record.tick_ms, "replayed": done.replayed.tick_ms},
        "errors": list(done.replayed.errors),
        "rules": [{"rule": rule, "tier": tier,
                   "recorded": msgspec.to_builtins(a) if a else None,
                   "replayed": msgspec.to_builtins(b) if b else None}
                  for rule, tier, a, b in _traces(record.trace, done.replayed.trace)]}


def _returned(trace: RuleTrace | None) -> str:
    if trace is None:
        return "(not in this chain)"
    if not trace.reached:
        return "not reached"
    if trace.error is not None:
        return f"raised: {trace.error}"
    effects = f" ({', '.join(trace.effects)})" if trace.effects else ""
    return f"{len(trace.effects)} effects{effects}, {trace.tick_ms} ms"


def _print(done: TickReplay, ran: str, *, verbose: bool) -> None:
    record, diff = done.tick.record, done.diff
    print(f"tick {record.number} (event #{done.tick.seq}, on the log up to #{record.curr.seq}, "
          f"{len(record.curr.vitals)} vitals keys) recorded by revision "
          f"{record.revision or 'none'}, replayed by {ran}; nothing was written to the home")
    print(f"effects: {len(diff.same)} same, {len(diff.changed)} changed, "
          f"{len(diff.missing)} missing, {len(diff.extra)} extra; tick_ms {record.tick_ms} "
          f"then, {done.replayed.tick_ms} now")
    rows = [["same", e.kind, to_json(e.payload)] for e in diff.same]
    for old, new in diff.changed:
        rows += [["changed", old.kind, f"was {to_json(old.payload)}"],
                 ["", "", f"now {to_json(new.payload)}"]]
    rows += [["missing", e.kind, to_json(e.payload)] for e in diff.missing]
    rows += [["extra", e.kind, to_json(e.payload)] for e in diff.extra]
    if rows:
        print_table(("", "KIND", "EFFECT"), rows, "")
    for error in done.replayed.errors:
        print(f"error in the replay: {error}")
    if verbose:
        print_table(("RULE (outermost first)", "LAYER", "RECORDED", "REPLAYED"),
                    [[rule, tier, _returned(a), _returned(b)]
                     for rule, tier, a, b in _traces(record.trace, done.replayed.trace)], "")
