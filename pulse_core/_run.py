"""Running an engine until a signal: what `Engine.run_forever()` waits on."""

from __future__ import annotations

import asyncio
import signal
import threading
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from pulse_core._errors import SignalsUnavailable

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that stop an engine run by `run_forever()`: a service manager's stop, Ctrl-C."""


@asynccontextmanager
async def stop_signals(signals: Sequence[signal.Signals] = STOP_SIGNALS
                       ) -> AsyncIterator[asyncio.Future[signal.Signals]]:
    """A future that resolves to the first of `signals` received while inside. Later signals
    are ignored: a second Ctrl-C does not cut a drain short. On exit the handlers set before
    with `signal.signal` are put back; ones a loop set with `add_signal_handler` are removed
    (asyncio offers no way to read them back).

    Raises SignalsUnavailable outside the main thread, where signals cannot be handled.
    """
    if threading.current_thread() is not threading.main_thread():
        raise SignalsUnavailable(
            "run_forever() handles SIGTERM and SIGINT and so runs in the main thread — "
            "elsewhere use `async with engine:` and stop it yourself")
    previous = {signum: signal.getsignal(signum) for signum in signals}
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
            before = previous[signum]
            if before is not None and getattr(before, "__module__", "") != "asyncio.unix_events":
                signal.signal(signum, before)  # a handler of the program's own
