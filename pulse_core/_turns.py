"""Whose turn it is to claim an effect, when several executor loops share one log.

Every loop that sees a new effect could claim it, but only one claim wins: with N loops on
one PostgreSQL log, each effect would cost N claims, N - 1 of them refused after queueing for
the log's writer lock (and a read each, to learn why). So each effect has one first choice:
among the loops seen claiming effects of its type lately (and this one), the owner with the
highest rendezvous hash of the effect's id and its own. Loops that see the same claimers
pick the same one, and a loop that comes or goes moves only its share of the effects. The
others leave the effect to it for `wait_s`, then claim it too (exactly one claim still wins,
as ever), and count the first choice out until it is seen claiming again: it is busy (no
free slot), stuck, or gone, and whichever it is, its effects should not wait for it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from pulse_core._effects import EffectEntry, EffectStatus

WAIT_S = 0.05
"""How long an effect waits for its first choice before any loop may claim it."""
WINDOW_S = 60.0
"""A loop not seen claiming effects of a type for this long is no first choice for it."""
_UNCLAIMED = (EffectStatus.PENDING, EffectStatus.RETRYING)


class Turns:
    """The first choice of each effect for the loop `me`, learned from the claims it sees.

    Times are one monotonic clock's seconds (the loop's own: no other host's clock counts).
    A loop that has seen no other claimer of a type is every such effect's first choice, so
    a lone loop never waits.
    """

    def __init__(self, me: str, *, wait_s: float = WAIT_S, window_s: float = WINDOW_S) -> None:
        self.me = me
        self.wait_s = wait_s
        self.window_s = window_s
        self._claimers: dict[str, dict[str, float]] = {}  # type -> owner -> last seen
        self._waiting: dict[str, tuple[int, float, str]] = {}  # id -> version, until, first

    @property
    def waiting(self) -> int:
        """How many effects this loop is leaving to their first choice."""
        return len(self._waiting)

    def seen(self, tag: str, owner: str, at: float) -> None:
        """`owner` claimed an effect of type `tag` at `at` (its newest claim counts)."""
        claimers = self._claimers.setdefault(tag, {})
        claimers[owner] = max(at, claimers.get(owner, at))

    def mine(self, entry: EffectEntry, at: float) -> bool:
        """Whether this loop may claim `entry` (claimable but for whose turn it is) at `at`:
        it is the first choice, or the first choice has had `wait_s` and not claimed it."""
        waiting = self._waiting.get(entry.id)
        if waiting is None or waiting[0] != entry.version:
            first = self.first_choice(entry.tag, entry.id, at)
            if first == self.me:
                return True
            self._waiting[entry.id] = (entry.version, at + self.wait_s, first)
            return False
        _, until, first = waiting
        if at < until:
            return False
        del self._waiting[entry.id]
        claimers = self._claimers.get(entry.tag)
        if claimers is not None:
            claimers.pop(first, None)  # counted again once seen claiming
        return True

    def first_choice(self, tag: str, effect_id: str, at: float) -> str:
        """The owner whose turn effect `effect_id` of type `tag` is, as this loop sees it."""
        claimers = self._claimers.get(tag)
        if not claimers:
            return self.me
        self._forget_before(at - self.window_s, claimers)
        return max((self.me, *claimers), key=lambda owner: _rank(effect_id, owner))

    def next_s(self, at: float) -> float | None:
        """Seconds from `at` until the soonest wait still running ends (None: none runs)."""
        soonest = min((until for _, until, _ in self._waiting.values() if until > at),
                      default=None)
        return None if soonest is None else soonest - at

    def keep(self, entries: Mapping[str, EffectEntry], at: float) -> None:
        """Forget the waits of effects no longer waiting for a claim in `entries` (the
        index): claimed, finished, or gone; and the claimers not seen within the window."""
        for gone in [i for i in self._waiting if (entry := entries.get(i)) is None
                     or entry.status not in _UNCLAIMED]:
            del self._waiting[gone]
        for tag, claimers in list(self._claimers.items()):
            self._forget_before(at - self.window_s, claimers)
            if not claimers:
                del self._claimers[tag]

    @staticmethod
    def _forget_before(since: float, claimers: dict[str, float]) -> None:
        for owner in [o for o, seen in claimers.items() if seen < since]:
            del claimers[owner]


def _rank(effect_id: str, owner: str) -> bytes:
    """`owner`'s rendezvous rank for `effect_id`: every loop computes the same, and the
    owners' ranks for one effect are independent (a CRC's are not: it is linear)."""
    return hashlib.blake2b(f"{effect_id}\0{owner}".encode(), digest_size=8).digest()
