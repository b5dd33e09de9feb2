"""A running engine's housekeeping: its last snapshot persisted every MEMO_EVERY_S (and at
close), expired vitals deleted every GC_EVERY_S."""

from __future__ import annotations

import asyncio

from pulse_core._supervisor import Reporter
from pulse_core._ticker import Ticker
from pulse_core.store import Retention, VitalsStore

MEMO_EVERY_S = 10.0
"""How often a running engine persists its last snapshot (and at close)."""

GC_EVERY_S = 60.0
"""How often a running engine deletes the vitals its Retention no longer keeps."""


async def save_memo(ticker: Ticker, report: Reporter) -> None:
    """Persist `ticker`'s memo; a disk that refuses it is reported (`engine:tick-memo`)."""
    try:
        await ticker.save_memo()
    except OSError as exc:
        report("engine:tick-memo", exc)


async def housekeeping(ticker: Ticker, vitals: VitalsStore, retention: Retention,
                       report: Reporter) -> None:
    """Save the memo and collect vitals on their schedules, until cancelled."""
    loop = asyncio.get_running_loop()
    last_gc = loop.time()
    while True:
        await asyncio.sleep(MEMO_EVERY_S)
        await save_memo(ticker, report)
        if loop.time() - last_gc >= GC_EVERY_S:
            last_gc = loop.time()
            await vitals.gc(retention)
