"""`upulse tick`: one tick of the engine the daemon would build, on a scratch copy of the home.

The copy (which the promote gate's dry run makes too) goes through SQLite's backup API over
read-only connections, consistent even while the daemon writes; no file of the live home is
written, not even a -shm. A log on a server (PostgreSQL) is read read-only, row by row, into
the copy's own events.db. The engine is built by pulse_cli.assembly.build_engine, as the
daemon's is, and ticks once through its own rule chain (the business time box included); its
trace says what each rule did.
"""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from pulse_cli import config as config_file
from pulse_cli.assembly import build_engine, load_code, uncommitted_note
from pulse_cli.home import Home
from pulse_cli.output import print_json, print_table, to_json
from pulse_cli.stores import LogUnavailable, log_file, store_url, unavailable
from pulse_core import Decision, HomeLayout, RuleTrace, StoreError, open_home
from pulse_core.store import SqliteEventStore, StoredRow, open_event_store
from pulse_core.store._commit import INSERT, UPSERT_HEAD


def _backup(source: Path, target: Path) -> None:
    """A consistent copy of SQLite database `source` in `target`; nothing else is written.

    Without a -wal file the database file alone holds everything: it is read as immutable
    (no lock, no -wal or -shm created). With a -wal and its -shm (an engine has it open, or
    one crashed), the WAL's commits are read with the -shm mapped read-only, so it is never
    rewritten. A -wal without its -shm cannot be open anywhere: the two files are copied to
    `target` and the WAL is checkpointed there.
    """
    if not source.exists():
        return
    wal, shm = (source.with_name(source.name + suffix) for suffix in ("-wal", "-shm"))
    if wal.exists() and not shm.exists():
        shutil.copyfile(source, target)
        shutil.copyfile(wal, target.with_name(target.name + "-wal"))
        copy = sqlite3.connect(target)
        try:
            copy.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            copy.close()
        return
    mode = "readonly_shm=1" if wal.exists() else "immutable=1"
    src = sqlite3.connect(f"{source.absolute().as_uri()}?mode=ro&{mode}", uri=True)
    try:
        dst = sqlite3.connect(target)
        try:
            src.backup(dst)
        finally:
            dst.close()
    finally:
        src.close()


def _copy_files(live: Home, scratch: HomeLayout, log: Path | None) -> None:
    """Checkpoints first (so none is ahead of the copied log), then the event log when it is
    a file, vitals, the side store and config.json."""
    scratch.root.mkdir(parents=True, exist_ok=True)
    if live.layout.checkpoints.is_dir():
        shutil.copytree(live.layout.checkpoints, scratch.checkpoints)
    if log is not None:
        _backup(log, scratch.events_db)
    _backup(live.layout.vitals_db, scratch.vitals_db)
    _backup(live.layout.side_db, scratch.side_db)
    if live.config.is_file():
        shutil.copyfile(live.config, Home(scratch.root).config)


def copy_live_home(live: Home, scratch: HomeLayout, *, page: int = 5_000) -> None:
    """Copy what an engine reads (checkpoints, the event log, vitals, the side store) from the
    home `live` into the scratch home `scratch`, together with config.json.

    The event log is read where config.json's store URL puts it and copied to the scratch
    home's own events.db: a SQLite file through SQLite's backup API, a log on a server
    (PostgreSQL) row by row, exactly (same seq, ids, versions, data bytes), read-only.
    LogUnavailable when that server cannot be reached. Blocking: call it in a thread.
    """
    cfg = config_file.load_or_default(live.config)
    log = log_file(live, cfg)
    _copy_files(live, scratch, log)
    if log is None:
        asyncio.run(_copy_served_log(store_url(live, cfg), scratch.events_db, page))


async def _copy_served_log(url: str, target: Path, page: int) -> None:
    """The rows of the log at `url` (on a server), copied exactly into a new SQLite log at
    `target` (created with pulse's schema, then filled page by page, with each key's head)."""
    try:
        source = await open_event_store(url, read_only=True)
    except StoreError as exc:
        raise LogUnavailable(unavailable(url, exc)) from None
    try:
        await (await SqliteEventStore.open(target)).close()  # the schema, empty
        after = 0
        while rows := await source.recorder.rows(after, page):
            _insert_rows(target, rows)  # this runs in copy_live_home's thread
            after = rows[-1].seq
    finally:
        await source.close()


def _insert_rows(target: Path, rows: list[StoredRow]) -> None:
    """Stored rows as they are, and the versions they bring their keys to, into the scratch
    events.db `target` (nothing else has it open) in one transaction."""
    heads: dict[str, int] = {}
    for row in rows:
        heads[row.key] = row.version
    db = sqlite3.connect(target, isolation_level=None)
    try:
        db.execute("BEGIN")
        db.executemany(INSERT, [msgspec.structs.astuple(row) for row in rows])
        db.executemany(UPSERT_HEAD, heads.items())
        db.execute("COMMIT")
    finally:
        db.close()


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
