"""A write that must not be lost to a short store outage: tried again while the store is
unavailable, and taken as done when a reply was lost and the log shows it stored."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from pulse_core._backoff import Backoff
from pulse_core._errors import (
    AppendOutcomeUnknown,
    InvalidTransition,
    LockLost,
    StoreUnavailable,
    VersionConflict,
)
from pulse_core._events import EventDraft, encode_data
from pulse_core.store import EventStore

log = logging.getLogger("pulse")

OUTAGE_BACKOFF = Backoff(initial_ms=200, factor=2.0, max_ms=5_000, jitter=0.1)
"""Spacing of the tries of a write through a store outage."""


async def write_through_outage(write: Callable[[], Awaitable[object]], *, patience_s: float,
                               what: str,
                               written: Callable[[], Awaitable[bool]] | None = None) -> None:
    """Await `write()`, and while it raises StoreUnavailable, again after OUTAGE_BACKOFF,
    until `patience_s` seconds have passed since the first try (each later try is cut off
    then); the first failure is logged as a warning naming `what`. A LockLost ends the
    tries at once (inside the block of a lock that was lost, every try would be refused):
    raised as it is, or as AppendOutcomeUnknown after a try whose outcome was unknown.

    Retrying is safe for a write that sends the same drafts each time, each with an `idem`,
    or one that expects a key's version. After a try whose outcome was unknown
    (AppendOutcomeUnknown), a VersionConflict or InvalidTransition that `written()` explains
    (it finds the write stored) counts as done. Past `patience_s` the last error is raised:
    AppendOutcomeUnknown if any try's outcome was unknown, so the caller never takes a write
    that may be stored for one that was not.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience_s
    failures, unknown = 0, False
    while True:
        try:
            if failures:
                async with asyncio.timeout_at(deadline):
                    await write()
            else:
                await write()
            return
        except (VersionConflict, InvalidTransition):
            if unknown and written is not None and await written():
                return
            raise
        except LockLost as exc:  # not an outage: leave the block and take the lock again
            if unknown:  # an earlier try may be stored: never reported as not stored
                raise AppendOutcomeUnknown(
                    f"{what} may or may not be stored: a reply was lost, then {exc}") from exc
            raise
        except TimeoutError:
            if not failures or loop.time() < deadline:
                raise  # the write's own, not the cut-off
            raise AppendOutcomeUnknown(  # a try cut off may have been stored
                f"{what} may or may not be stored: the store did not answer within "
                f"{patience_s:g} s") from None
        except StoreUnavailable as exc:
            unknown = unknown or isinstance(exc, AppendOutcomeUnknown)
            failures += 1
            delay = OUTAGE_BACKOFF.delay_ms(failures) / 1000
            if loop.time() + delay >= deadline:
                if unknown and not isinstance(exc, AppendOutcomeUnknown):
                    raise AppendOutcomeUnknown(
                        f"{what} may or may not be stored: a reply was lost, and the store "
                        f"did not answer within {patience_s:g} s ({exc})") from exc
                raise
            if failures == 1:
                log.warning("pulse: %s: the store cannot take it yet (%s); trying again for "
                            "up to %g s", what, exc, patience_s)
            await asyncio.sleep(delay)


async def stored_next(store: EventStore, key: str, version: int, draft: EventDraft) -> bool:
    """Whether `key`'s event after `version` is `draft` (its kind, origin and data): an append
    of it that expected `version` and whose reply was lost."""
    data = encode_data(draft.data)
    return any(e.version == version + 1 and e.kind == draft.kind and e.origin == draft.origin
               and encode_data(e.data) == data for e in await store.read(key=key))
