"""`upulse tick`: one tick against the live snapshot, on a scratch copy, writing nothing.

The copy is pulse_cli.gate's: SQLite's backup API through read-only connections, consistent
even while the daemon writes; the live files are never written to.
"""

from __future__ import annotations

import asyncio
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from pulse_cli import config as config_file
from pulse_cli.daemon import build_engine, load_code
from pulse_cli.gate import copy_live_home
from pulse_cli.home import Home
from pulse_cli.output import print_json, print_table, to_json
from pulse_core import Decision, Inner, Rule, Snapshot, compose, default_builtin_rules, guarded
from pulse_core.rules import rule_name
from pulse_survival import survival_layer


def copy_home(home: Home, target: Path) -> int:
    """Consistent copies of what a tick reads from `home` (checkpoints, events.db,
    vitals.db) in `target`, read without writing (blocking); returns the last seq copied."""
    target.mkdir(parents=True, exist_ok=True)
    copy_live_home(home.root, target)
    conn = sqlite3.connect(target / home.events_db.name)
    try:
        return int(conn.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0])
    finally:
        conn.close()


@dataclass
class RuleTrace:
    """What one rule was handed by the rules inside it, and what it returned."""

    rule: str
    inner: Decision | None = None
    returned: Decision | None = None
    error: str | None = None


def _traced(rule: Rule, trace: RuleTrace) -> Rule:
    async def traced(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        async def spy(p: Snapshot, c: Snapshot) -> Decision:
            trace.inner = await inner(p, c)
            return trace.inner

        trace.returned = await rule(prev, curr, spy)
        return trace.returned

    traced.name = trace.rule  # type: ignore[attr-defined]
    return traced


def _decision(decision: Decision | None) -> dict[str, Any] | None:
    if decision is None:
        return None
    return {"effects": [msgspec.to_builtins(e) for e in decision.effects],
            "tick_ms": decision.tick_ms}


def _said(decision: Decision | None) -> str:
    if decision is None:
        return "-"
    tags = [type(e).tag() for e in decision.effects]
    return f"{len(tags)} effects{' (' + ', '.join(tags) + ')' if tags else ''}, " \
           f"{decision.tick_ms} ms"


async def dry_tick(home: Home, *, verbose: bool, as_json: bool,
                   code_dir: Path | None = None) -> int:
    """Run the whole rule chain once on a scratch copy of `home` and print what it decided.

    `prev` is the empty snapshot a daemon's first tick sees; survival rules start fresh, as
    in a daemon that has just started. Nothing is written to `home`.
    """
    cfg = config_file.load(home.require().config)
    parts = load_code(code_dir or home.engine)
    with tempfile.TemporaryDirectory(prefix="upulse-tick-") as tmp:
        scratch = Path(tmp)
        seen = await asyncio.to_thread(copy_home, home, scratch)
        engine = build_engine(scratch, cfg, parts)
        await engine.open()
        try:
            curr = await engine.snapshot()
            prev = Snapshot(seq=0, at=curr.at, number=0, vitals={},
                            projections=curr.projections, last_tick_ms=curr.last_tick_ms)
            rules = [*survival_layer(cfg.survival, scratch).rules, *default_builtin_rules(),
                     *parts.rules]
            traces = [RuleTrace(rule_name(r)) for r in rules]

            def failed(name: str, exc: BaseException) -> None:
                for trace in traces:
                    if trace.rule == name:
                        trace.error = f"{type(exc).__name__}: {exc}"

            chain = compose([guarded(_traced(r, t), failed) for r, t in zip(rules, traces,
                                                                           strict=True)],
                            cfg.default_tick_ms)
            decision = await chain(prev, curr)
        finally:
            await engine.close()
    report = {
        "seq": seen, "revision": parts.revision, "decision": _decision(decision),
        "rules": [{"rule": t.rule, "inner": _decision(t.inner),
                   "returned": _decision(t.returned), "error": t.error} for t in traces],
    }
    if as_json:
        print_json(report)
        return 0
    print(f"one tick on a scratch copy of {home.root} up to event #{seen}, "
          f"{len(curr.vitals)} vitals keys, {len(curr.pending_effects)} pending effects "
          f"(nothing was written to the home)")
    if verbose:
        rows = [[t.rule, _said(t.inner), _said(t.returned), t.error or ""] for t in traces]
        print_table(("RULE (outermost first)", "INNER DECIDED", "RULE RETURNED", "ERROR"),
                    rows, "")
    print(f"decision: {_said(decision)}")
    for effect in decision.effects:
        print(f"  {to_json(msgspec.to_builtins(effect))}")
    return 0
