"""The cost of sealing memory element text: writing and reading it sealed beside plain.

    python -m bench.sealing [--elements 20000] [--batch 100] [--chars 200]

`--elements` human exchanges (each its own element, so each gets a key of its own), text of
`--chars` characters, are appended `--batch` drafts per call through a SqliteEventStore
(synchronous=FULL, WAL) twice in the same run, on the same disk: once with element keys
(keys.db beside the log: every text sealed with AES-256-GCM, one key made per element) and
once without (plain, as a store opened without a home writes). Then every exchange's text is
read back from each log: `store.read` and, for the sealed log, `reveal` of each text with
keys.db (one key read per element).

Prints elements/s for each, and the ratio sealed/plain for writing and for reading. No
floor: the figures say what a purge that really erases costs.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from pathlib import Path

from bench.common import Figure, Report, temp_dir
from pulse_core import EventDraft
from pulse_core.memory import exchange_draft
from pulse_core.store import ElementKeys, SqliteEventStore, reveal


def drafts(elements: int, chars: int) -> list[EventDraft]:
    """One human exchange per element over 100 identities, text of `chars` characters."""
    body = ("the passport number is X123, lives by the sea " * (chars // 40 + 1))[:chars]
    return [exchange_draft(f"id-{i % 100}", f"{i:08d} {body}", record=f"x-{i}")
            for i in range(elements)]


async def write(path: Path, batch: list[EventDraft], size: int, *, sealed: bool) -> float:
    """Append `batch` `size` drafts per call; elements/s."""
    store = await SqliteEventStore.open(path / "events.db", synchronous="FULL")
    if sealed:
        store.keys = ElementKeys(path / "keys.db")
    try:
        started = time.perf_counter()
        for at in range(0, len(batch), size):
            await store.append(batch[at:at + size])
        return len(batch) / (time.perf_counter() - started)
    finally:
        await store.close()


async def read(path: Path, *, sealed: bool) -> tuple[float, int]:
    """Every exchange's text read back (opened when sealed); elements/s and characters."""
    store = await SqliteEventStore.open(path / "events.db")
    keys = ElementKeys(path / "keys.db", read_only=True) if sealed else None
    try:
        started = time.perf_counter()
        events = await store.read(kinds=["human-exchange"])
        if keys is not None:
            texts = await asyncio.to_thread(
                lambda: [reveal(e.data["text"], keys) for e in events])
        else:
            texts = [e.data["text"] for e in events]
        rate = len(events) / (time.perf_counter() - started)
        return rate, sum(len(t) for t in texts)
    finally:
        if keys is not None:
            keys.close()
        await store.close()


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.sealing", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=20_000, help="exchanges written")
    parser.add_argument("--batch", type=int, default=100, help="drafts per append call")
    parser.add_argument("--chars", type=int, default=200, help="characters of each text")
    parser.add_argument("--tmp", default=None, help="base directory for the databases")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> Report:
    report = Report(f"sealing: {args.elements:,} exchanges of {args.chars} characters, "
                    f"{args.batch} drafts/call (synchronous=FULL, WAL), sealed beside plain")
    batch = drafts(args.elements, args.chars)
    with temp_dir(args.tmp) as plain_dir, temp_dir(args.tmp) as sealed_dir:
        plain_write = await write(plain_dir, batch, args.batch, sealed=False)
        sealed_write = await write(sealed_dir, batch, args.batch, sealed=True)
        plain_read, plain_chars = await read(plain_dir, sealed=False)
        sealed_read, sealed_chars = await read(sealed_dir, sealed=True)
    assert plain_chars == sealed_chars, (plain_chars, sealed_chars)
    report.compare(Figure("sealed write", sealed_write, "elements/s"),
                   Figure("plain write", plain_write, "elements/s"))
    report.compare(Figure("sealed read+open", sealed_read, "elements/s"),
                   Figure("plain read", plain_read, "elements/s"))
    report.note("ratio = sealed / plain (1.00: sealing costs nothing); a sealed write makes "
                "the element's key in keys.db and encrypts; a sealed read reads the key and "
                "decrypts")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse(argv))).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
