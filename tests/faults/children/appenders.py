"""Child of test_crash_holds: concurrent appenders with idempotency keys and expected versions.

Worker w owns key `w<w>`. Its op i appends two drafts in one transaction (`op` on `w<w>`
expecting version i, and `side` on `w<w>-side`), each with its own idempotency key, and
journals `try w i` before and `ok w i` after. On start, a worker whose last journaled op has
no `ok` sends exactly that append again and journals whether it was a replay or new.
Prints `ready` once every worker has started; runs until killed or `--seconds` pass.
"""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path

from pulse_core import EventDraft, VersionConflict, register_kind
from pulse_core.store import EventStore, SqliteEventStore

register_kind("fault-op", "one op of a crash-test appender")


def journal(path: Path, line: str) -> None:
    """One O_APPEND write: survives SIGKILL of this process (the page cache keeps it)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def drafts(w: int, i: int) -> list[EventDraft]:
    return [
        EventDraft("fault-op", f"w{w}", {"w": w, "i": i, "part": 0}, origin="agent",
                   idem=f"w{w}-{i}-a"),
        EventDraft("fault-op", f"w{w}-side", {"w": w, "i": i, "part": 1}, origin="agent",
                   idem=f"w{w}-{i}-b"),
    ]


def unfinished(path: Path, workers: int) -> dict[int, int]:
    """Per worker, the op it journaled as tried but not as ok (at most one each)."""
    tried: dict[int, int] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            fields = line.split()
            if len(fields) == 3 and fields[0] == "try":
                tried[int(fields[1])] = int(fields[2])
            elif (len(fields) == 3 and fields[0] == "ok"
                  and tried.get(int(fields[1])) == int(fields[2])):
                del tried[int(fields[1])]
    return {w: i for w, i in tried.items() if w < workers}


async def worker(store: EventStore, path: Path, w: int, retry: int | None) -> None:
    if retry is not None:
        result = await store.append(drafts(w, retry), expect={f"w{w}": retry})
        journal(path, f"{'replayed' if result.replayed else 'new'} {w} {retry}")
        journal(path, f"ok {w} {retry}")
    i = await store.head(f"w{w}")
    while True:
        journal(path, f"try {w} {i}")
        try:
            await store.append(drafts(w, i), expect={f"w{w}": i})
        except VersionConflict:
            journal(path, f"conflict {w} {i}")
            raise
        journal(path, f"ok {w} {i}")
        i += 1


async def main(args: argparse.Namespace) -> None:
    path = Path(args.journal)
    store = await SqliteEventStore.open(Path(args.home) / "events.db")
    retries = unfinished(path, args.workers)
    tasks = [asyncio.create_task(worker(store, path, w, retries.get(w)))
             for w in range(args.workers)]
    print("ready", flush=True)
    done, _ = await asyncio.wait(tasks, timeout=args.seconds,
                                 return_when=asyncio.FIRST_EXCEPTION)
    for task in done:
        task.result()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("home")
    parser.add_argument("journal")
    parser.add_argument("--workers", type=int, default=24)
    parser.add_argument("--seconds", type=float, default=60.0)
    asyncio.run(main(parser.parse_args()))
