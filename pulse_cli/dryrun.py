"""`upulse tick`: one tick of the engine the daemon would build, on a scratch copy of the home.

The copy is pulse_cli.gate's: SQLite's backup API through read-only connections, consistent
even while the daemon writes; the live files are never written to. The engine is built by
pulse_cli.assembly.build_engine, as the daemon's is, and ticks once through its own rule chain
(the business time box included); its trace says what each rule did.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from pulse_cli import config as config_file
from pulse_cli.assembly import build_engine, load_code
from pulse_cli.gate import copy_live_home
from pulse_cli.home import Home
from pulse_cli.output import print_json, print_table, to_json
from pulse_core import Decision, HomeLayout, RuleTrace, open_home


async def copy_home(home: Home, target: Path) -> int:
    """Consistent copies of what an engine reads from `home` (checkpoints, the event log,
    vitals, the side store, config.json) in `target`, read without writing; returns the last
    seq copied."""
    await asyncio.to_thread(copy_live_home, home, HomeLayout(target))
    stores = await open_home(target, read_only=True)
    try:
        return await stores.events.last_seq()
    finally:
        await stores.close()


def scratch_config(home: Home) -> config_file.Config:
    """`home`'s config, with the scratch home's own event log."""
    return dataclasses.replace(config_file.load(home.require().config), store=None)


def _decision(decision: Decision) -> dict[str, Any]:
    return {"effects": [msgspec.to_builtins(e) for e in decision.effects],
            "tick_ms": decision.tick_ms}


def _said(decision: Decision) -> str:
    tags = [type(e).tag() for e in decision.effects]
    return f"{len(tags)} effects{' (' + ', '.join(tags) + ')' if tags else ''}, " \
           f"{decision.tick_ms} ms"


def _returned(trace: RuleTrace) -> str:
    if not trace.reached:
        return "not reached"
    if trace.error is not None:
        return "raised (passed through)"
    effects = f" ({', '.join(trace.effects)})" if trace.effects else ""
    return f"{len(trace.effects)} effects{effects}, {trace.tick_ms} ms"


async def dry_tick(home: Home, *, verbose: bool, as_json: bool,
                   code_dir: Path | None = None) -> int:
    """Tick once, on a scratch copy of `home`, the engine its daemon would build (with the
    code in `code_dir`, default HOME/engine), after one reading of every watcher; print what
    it decided. Nothing is written to `home`."""
    cfg = scratch_config(home)
    code = await asyncio.to_thread(load_code, code_dir or home.engine)
    with tempfile.TemporaryDirectory(prefix="upulse-tick-") as tmp:
        scratch = Path(tmp)
        seen = await copy_home(home, scratch)
        engine = build_engine(scratch, cfg, code)
        await engine.open()
        try:
            await engine.sample()
            curr = await engine.snapshot()
            decision = await engine.tick()
            trace = engine.trace
        finally:
            await engine.close()
    report = {"seq": seen, "revision": code.revision, "decision": _decision(decision),
              "rules": [msgspec.to_builtins(t) for t in trace]}
    if as_json:
        print_json(report)
        return 0
    print(f"one tick on a scratch copy of {home.root} up to event #{seen}, {len(curr.vitals)} "
          f"vitals keys, {len(curr.pending_effects)} pending effects (nothing was written to "
          "the home)")
    if verbose:
        rows = [[t.rule, t.tier, _returned(t), t.error or ""] for t in trace]
        print_table(("RULE (outermost first)", "LAYER", "RETURNED", "ERROR"), rows, "")
    print(f"decision: {_said(decision)}")
    for effect in decision.effects:
        print(f"  {to_json(msgspec.to_builtins(effect))}")
    return 0
