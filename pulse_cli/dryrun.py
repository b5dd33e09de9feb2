"""`upulse tick`: one tick of the engine the daemon would build, on a scratch copy of the home.

The copy (which the promote gate's dry run makes too) goes through SQLite's backup API over
read-only connections, consistent even while the daemon writes; no file of the live home is
written, not even a -shm. A log of another backend (on a server: PostgreSQL) is read
read-only, row by row, into the copy's own events.db (pulse_core.store.copy_log). The engine
is built by pulse_cli.assembly.build_engine, as the daemon's is, and ticks once through its
own rule chain (the business time box included); its trace says what each rule did.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from pulse_cli import config as config_file
from pulse_cli.assembly import build_engine, load_code, uncommitted_note
from pulse_cli.home import Home
from pulse_cli.output import print_json, print_table, to_json
from pulse_cli.stores import LogUnavailable, store_url, unavailable
from pulse_core import Decision, HomeLayout, RuleTrace, StoreError, open_home
from pulse_core.store import copy_log, copy_sqlite_file


def copy_live_home(live: Home, scratch: HomeLayout, *, page: int = 5_000) -> None:
    """Copy what an engine reads (checkpoints, the event log, vitals, the side store) from the
    home `live` into the scratch home `scratch`, together with config.json.

    Checkpoints come first, so none is ahead of the copied log. The event log is read where
    config.json's store URL puts it and copied, read-only and exactly, to the scratch home's
    own events.db (pulse_core.store.copy_log: a SQLite file with SQLite's backup API, a log
    of any other backend row by row); LogUnavailable when it cannot be read. Blocking: call
    it in a thread.
    """
    cfg = config_file.load_or_default(live.config)
    scratch.root.mkdir(parents=True, exist_ok=True)
    if live.layout.checkpoints.is_dir():
        shutil.copytree(live.layout.checkpoints, scratch.checkpoints)
    url = store_url(live, cfg)
    try:
        asyncio.run(copy_log(url, scratch.events_db, page=page))
    except StoreError as exc:
        raise LogUnavailable(unavailable(url, exc)) from None
    copy_sqlite_file(live.layout.vitals_db, scratch.vitals_db)
    copy_sqlite_file(live.layout.side_db, scratch.side_db)
    if live.config.is_file():
        shutil.copyfile(live.config, Home(scratch.root).config)


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
    return config_file.on_scratch(config_file.load_or_default(home.readable().config))


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
    files in `code_dir`, default HOME/engine's committed code), after one reading of every
    watcher; print what it decided. Nothing is written to `home`."""
    cfg = scratch_config(home)
    code = await asyncio.to_thread(load_code, code_dir or home.engine,
                                   staged=code_dir is not None)
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
    report = {"seq": seen, "revision": code.revision, "uncommitted": list(code.uncommitted),
              "decision": _decision(decision), "rules": [msgspec.to_builtins(t) for t in trace]}
    if as_json:
        print_json(report)
        return 0
    print(f"one tick on a scratch copy of {home.root} up to event #{seen}, {len(curr.vitals)} "
          f"vitals keys, {len(curr.pending_effects)} pending effects (nothing was written to "
          "the home)")
    if code.uncommitted:
        print(uncommitted_note(code_dir or home.engine, code))
    if verbose:
        rows = [[t.rule, t.tier, _returned(t), t.error or ""] for t in trace]
        print_table(("RULE (outermost first)", "LAYER", "RETURNED", "ERROR"), rows, "")
    print(f"decision: {_said(decision)}")
    for effect in decision.effects:
        print(f"  {to_json(msgspec.to_builtins(effect))}")
    return 0
