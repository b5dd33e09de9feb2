"""Claims on a notice's delivery, kept in the log: each attempt is claimed first
(`openclaw-notice-claimed` at the attempt key, with that key's expected version), so engines
sharing one log never attempt one notice at once."""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Any

from pulse_core import (
    EventDraft,
    EventStore,
    VersionConflict,
    process_started,
    register_kind,
    still_running,
)

ORIGIN = "executor:openclaw-notices"
CLAIMED = "openclaw-notice-claimed"

register_kind(CLAIMED, "an engine attempts a notice's delivery; key: "
                       "openclaw-notice-attempt:<effect id>; data: owner, host, pid, started, "
                       "until_ms (the claim's lease)")


def attempt_key(effect_id: str) -> str:
    """The key of an effect's delivery attempts: claims and failures."""
    return f"openclaw-notice-attempt:{effect_id}"


class NoticeClaims:
    """One notice service's claims: its owner id on this host, each claim standing for
    `lease_s` seconds unless renewed."""

    def __init__(self, lease_s: float) -> None:
        self.lease_s = lease_s
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"
        self.host = socket.gethostname()

    async def claim(self, events: EventStore, effect_id: str, cause: int) -> bool:
        """Whether this service may attempt the delivery now: no live claim of another
        engine stands (one ends with its lease, or at once when its process on this host is
        gone), and this one's claim was appended first."""
        version, claim = await self._newest(events, effect_id)
        if claim is not None and self._held_elsewhere(claim):
            return False
        return await self._claim_at(events, effect_id, cause, version)

    async def renew(self, events: EventStore, effect_id: str, cause: int) -> bool:
        """Extend this service's claim on `effect_id`'s delivery; False when another
        engine's claim is the newest (this one ran out and was taken over)."""
        version, claim = await self._newest(events, effect_id)
        if claim is None or claim.get("owner") != self.owner:
            return False
        return await self._claim_at(events, effect_id, cause, version)

    async def release(self, events: EventStore, effect_id: str) -> None:
        """End this service's claim on `effect_id`'s delivery, if it holds the newest."""
        version, claim = await self._newest(events, effect_id)
        if claim is not None and claim.get("owner") == self.owner:
            where = attempt_key(effect_id)
            await events.append([EventDraft(CLAIMED, where, {**claim, "until_ms": 0},
                                            origin=ORIGIN)], expect={where: version})

    @staticmethod
    async def _newest(events: EventStore, effect_id: str) -> tuple[int, Any]:
        """The version of `effect_id`'s attempt key and the data of the newest claim at it
        (None when none), the version read first: a claim appended in between makes the
        next append at that version conflict."""
        where = attempt_key(effect_id)
        version = await events.head(where)
        claims = await events.read(key=where, kinds=[CLAIMED], newest_first=True, limit=1)
        return version, (claims[0].data if claims else None)

    async def _claim_at(self, events: EventStore, effect_id: str, cause: int,
                        version: int) -> bool:
        """Append this service's claim (its lease from now) unless anything was appended
        at `effect_id`'s attempt key since its version `version` was read."""
        where = attempt_key(effect_id)
        claim = {"effect_id": effect_id, "owner": self.owner, "host": self.host,
                 "pid": os.getpid(), "started": process_started(os.getpid()),
                 "until_ms": int((time.time() + self.lease_s) * 1000)}
        try:
            await events.append([EventDraft(CLAIMED, where, claim, origin=ORIGIN, cause=cause)],
                                expect={where: version})
        except VersionConflict:
            return False
        return True

    def _held_elsewhere(self, claim: Any) -> bool:
        if not isinstance(claim, dict) or claim.get("owner") == self.owner:
            return False
        started = claim.get("started")
        if claim.get("host") == self.host and not (
                isinstance(started, (int, float))
                and still_running(int(claim.get("pid", 0)), float(started))):
            return False  # its process on this host is gone (or the pid is another's now)
        return bool(int(claim.get("until_ms", 0)) > time.time() * 1000)
