"""Running an engine until a signal: what `Engine.run_forever()` waits on."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from pulse_core._errors import PulseError

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that stop an engine run by `run_forever()`: a service manager's stop, Ctrl-C."""


@asynccontextmanager
async def stop_signals(signals: Sequence[signal.Signals] = STOP_SIGNALS
                       ) -> AsyncIterator[asyncio.Future[signal.Signals]]:
    """A future that resolves to the first of `signals` received while inside; their
    handlers are installed on entry and the previous ones restored on exit. Later signals
    are ignored: a second Ctrl-C does not cut a drain short.

    Raises PulseError outside the main thread, where signals cannot be handled.
    """
    if threading.current_thread() is not threading.main_thread():
        raise PulseError("run_forever() handles SIGTERM and SIGINT and so runs in the main "
                         "thread — elsewhere use `async with engine:` and stop it yourself")
    loop = asyncio.get_running_loop()
    received: asyncio.Future[signal.Signals] = loop.create_future()

    def stop(signum: signal.Signals) -> None:
        if not received.done():
            received.set_result(signum)

    for signum in signals:
        loop.add_signal_handler(signum, stop, signum)
    try:
        yield received
    finally:
        for signum in signals:
            loop.remove_signal_handler(signum)
