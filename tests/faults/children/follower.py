"""Child of test_readers_hold: follows events.db read-only with the change cursor and writes
each seq it sees to stdout, until it has seen `--until` events."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from pulse_core.store import SqliteEventStore


async def main(args: argparse.Namespace) -> None:
    store = await SqliteEventStore.open(Path(args.db), read_only=True)
    print("ready", flush=True)
    async for event in store.changes(poll_interval=0.02):
        print(event.seq, flush=True)
        if event.seq >= args.until:
            break
    await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("db")
    parser.add_argument("--until", type=int, required=True)
    asyncio.run(main(parser.parse_args()))
