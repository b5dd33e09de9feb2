"""Who holds a claim: the owner an executor loop writes into `effect-executing`, and how
another loop tells that the owner is gone.

An owner names its host. A loop judges a claim from another host by its lease only (a process
id means nothing across machines); a claim from its own host also by whether the owner's
process still lives, so a crashed process's claims are taken over at once. Host names must
therefore tell machines apart: two machines under one name would judge each other's process
ids.

A lease never compares two hosts' clocks: a claim says how long it holds (`lease_ms`), and
each loop counts that on its own clock from the moment it first saw the claim (`Leases`). A
loop sees a claim only after it committed, so its count ends no sooner than the claimer's.
"""

from __future__ import annotations

import heapq
import os
import socket
import time
from collections.abc import Callable, Iterable, Mapping

import msgspec
import psutil

from pulse_core._clock import Clock, SystemClock
from pulse_core._effects import EffectEntry, EffectStatus
from pulse_core._errors import PulseError
from pulse_core._events import uuid7

MAX_HOST_LENGTH = 255


_SINCE_BOOT = hasattr(time, "CLOCK_BOOTTIME")


def process_started(pid: int, *, zombie: bool = False, wall_clock: bool = False) -> float:
    """When process `pid` started, in seconds on the clock that counts from boot (where the
    system has one; else, or with `wall_clock`, on the wall clock): a value no step of the
    wall clock moves, which with the pid names one process. 0.0 if there is none, or it is
    dead: a zombie with no thread left only waits for its parent to reap it (`zombie`: a
    zombie counts as there)."""
    try:
        process = psutil.Process(pid)
        if not zombie and process.status() == psutil.STATUS_ZOMBIE \
                and process.num_threads() <= 1:
            return 0.0
        if wall_clock or not _SINCE_BOOT:
            return float(process.create_time())
        # psutil's start is the boot time (read now, on the wall clock, in whole seconds)
        # plus the start since boot: the difference is the latter, to the kernel's tick
        return round(process.create_time() - psutil.boot_time(), 3)
    except (psutil.NoSuchProcess, psutil.AccessDenied, ValueError):  # ValueError: pid < 0
        return 0.0


def process_age_s(pid: int) -> float:
    """How long process `pid` has run, in seconds, counted on the clock `process_started`
    reads (0.0 if there is none, or it is dead): the wall clock less psutil's start runs up
    to 1 s long (that start holds the boot time in whole seconds), and moves with a step of
    the wall clock."""
    started = process_started(pid)
    if not started:
        return 0.0
    now = time.clock_gettime(time.CLOCK_BOOTTIME) if _SINCE_BOOT else time.time()
    return max(0.0, now - started)


def started_on_wall_clock(started: float) -> bool:
    """Whether `started`, a start `process_started` gave, was read on the wall clock: as
    records written by versions before starts were read on the clock since boot hold it
    (a start since boot is below 1e9 s, 31 years of uptime)."""
    return started >= 1e9 or not _SINCE_BOOT


def still_running(pid: int, started: float) -> bool:
    """Whether process `pid` is the live process that `process_started` said started at
    `started` (False: it died, or the pid names another process now)."""
    now = process_started(pid, wall_clock=started_on_wall_clock(started))
    return now != 0.0 and now == started


def check_host(host: object) -> str:
    """`host` if it can name a host in claims (1..255 printable characters, no whitespace);
    else PulseError saying what to give instead."""
    if (not isinstance(host, str) or not 0 < len(host) <= MAX_HOST_LENGTH
            or not host.isprintable() or any(c.isspace() for c in host)):
        raise PulseError(f"host {host!r}: a host name must be 1..{MAX_HOST_LENGTH} printable "
                         "characters without spaces, one per machine (default: the machine's "
                         "hostname)")
    return host


def owner_host(owner_id: str) -> str:
    """The host named by an owner id (`host:pid:random`); '' when `owner_id` is not one."""
    parts = owner_id.rsplit(":", 2)
    return parts[0] if len(parts) == 3 else ""


class Owner(msgspec.Struct, frozen=True):
    """One executor loop as its claims name it: `id` (`host:pid:random`), and the host, pid
    and start time of its process, which tell a dead owner on the same host from a live one."""

    id: str
    host: str
    pid: int
    started: float

    @classmethod
    def here(cls, host: str | None = None) -> Owner:
        """A new owner for a loop of this process on `host` (default: the machine's
        hostname); PulseError for a host name that cannot be one."""
        host = check_host(socket.gethostname() if host is None else host)
        pid = os.getpid()
        return cls(f"{host}:{pid}:{uuid7()[-12:]}", host, pid, process_started(pid))

    def outlived(self, entry: EffectEntry) -> bool:
        """Whether `entry`'s claim was made by a process on this host that has died, or whose
        pid now names another process. Claims from other hosts are never judged so: only
        their lease ends them."""
        if entry.owner == self.id or owner_host(entry.owner) != self.host:
            return False
        if entry.owner_pid == self.pid and entry.owner_started == self.started:
            return False
        return not still_running(entry.owner_pid, entry.owner_started)


def _monotonic_ms() -> int:
    return time.monotonic_ns() // 1_000_000


class Leases:
    """When the lease of each claim a loop has seen ends for that loop: the claim's
    `lease_ms`, counted on the loop's own clock from the moment it first saw that claim (a
    claim first seen after a start counts as seen then). The claimer's clock is never read,
    so hosts whose clocks disagree still run one attempt at a time.

    The system clock is timed by the monotonic clock (a step of the wall clock ends no
    lease); an injected clock (tests, dry runs) by itself.
    """

    def __init__(self, clock: Clock) -> None:
        self._now: Callable[[], int] = (_monotonic_ms if isinstance(clock, SystemClock)
                                        else clock.now_ms)
        self._ends: dict[str, tuple[int, int]] = {}  # effect id: (claim's version, lease end)
        self._timers: list[tuple[int, str]] = []  # (lease end, id); stale ones too

    def observe(self, entries: Mapping[str, EffectEntry], changed: Iterable[str]) -> None:
        """Start the count of each claim among the `changed` ids of `entries` not seen
        before; forget those no longer claimed."""
        now = self._now()
        for effect_id in changed:
            entry = entries.get(effect_id)
            if entry is None or entry.status is not EffectStatus.EXECUTING:
                self._ends.pop(effect_id, None)
                continue
            seen = self._ends.get(effect_id)
            if seen is None or seen[0] != entry.version:
                self._ends[effect_id] = self._start(entry, now)

    def ended(self, entry: EffectEntry) -> bool:
        """Whether the lease of `entry`'s claim has run out as this loop counts it (a claim
        not seen before starts its count now)."""
        now = self._now()
        seen = self._ends.get(entry.id)
        if seen is None or seen[0] != entry.version:
            seen = self._ends[entry.id] = self._start(entry, now)
        return seen[1] <= now

    def _start(self, entry: EffectEntry, now: int) -> tuple[int, int]:
        end = now + entry.lease_ms
        heapq.heappush(self._timers, (end, entry.id))
        return entry.version, end

    def next_end_s(self) -> float | None:
        """Seconds until the soonest lease still counted ends (None: none)."""
        now = self._now()
        timers = self._timers
        while timers:
            end, effect_id = timers[0]
            seen = self._ends.get(effect_id)
            if end > now and seen is not None and seen[1] == end:
                return (end - now) / 1000
            heapq.heappop(timers)  # past, or the claim is gone or replaced since
        return None
