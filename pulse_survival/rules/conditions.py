"""resource_guard, network_watchdog and error_escalate: pressure, outages, error storms."""

from __future__ import annotations

from collections.abc import Sequence

from pulse_core import Decision, Effect, Inner, Quote, Snapshot
from pulse_survival.config import ErrorLogPolicy, NetworkTargets, ResourceThresholds
from pulse_survival.effects import ArchiveSessions, Cleanup, Notify
from pulse_survival.ledger import ErrorNotice
from pulse_survival.marks import ErrorsEscalated, NetworkOutageAnnounced, NetworkRecoveryAnnounced
from pulse_survival.rules.base import SurvivalRule, counted, latest, ledger, streak_marks
from pulse_survival.watchers import (
    LATEST,
    ErrorTotals,
    error_totals,
    network_outage,
    under_pressure,
)


class ResourceGuard(SurvivalRule):
    """Memory or disk over threshold for `samples` samples: archive old sessions and clean up;
    while under pressure, tick every `pressure_tick_ms`."""

    name = "resource_guard"
    emits = (ArchiveSessions, Cleanup)

    def __init__(self, policy: ResourceThresholds) -> None:
        self.policy = policy

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        p = self.policy
        newest = latest(curr, "system-resource")
        if newest is not None and newest.ok and under_pressure(newest.data, p.memory_pct,
                                                               p.disk_pct):
            tick_ms = min(tick_ms, p.pressure_tick_ms)
        samples = [s for s in curr.since_last_tick("system-resource") if s.ok]
        if not samples:
            return Decision(effects, tick_ms)
        before = streak = ledger(curr).streak(self.name)
        fired = False
        for sample in samples:
            streak = counted(streak, under_pressure(sample.data, p.memory_pct, p.disk_pct),
                             p.samples)
            if streak >= p.samples and not fired:
                # the action fires (once a tick): count again from zero, unlike monit's bug
                # #1030; a streak that reaches the threshold again fires on the next tick
                fired, streak = True, 0
        added: list[Effect] = []
        if fired:
            if p.session_folders:
                added.append(ArchiveSessions(folders=p.session_folders, archive_to=p.archive_to,
                                             older_than_s=p.older_than_s,
                                             max_files=p.max_files_per_run))
            added.append(Cleanup(folders=p.temp_folders, archive_to=p.archive_to,
                                 older_than_s=p.older_than_s, max_files=p.max_files_per_run))
        return Decision([*effects, *streak_marks(self.name, before, streak), *added], tick_ms)


class NetworkWatchdog(SurvivalRule):
    """Every configured probe kind failing (DNS and HTTP both, when both are configured) for
    `samples` samples: one notice per outage, one on recovery."""

    name = "network_watchdog"
    emits = (Notify,)

    def __init__(self, targets: NetworkTargets) -> None:
        self.targets = targets

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        samples = [s for s in curr.since_last_tick("network") if s.ok]
        if not samples:
            return Decision(effects, tick_ms)
        state = ledger(curr)
        before = streak = state.streak(self.name)
        announced = state.network_down
        added: list[Effect] = []
        for sample in samples:
            outage = network_outage(sample.data)
            if announced:
                if not outage:
                    announced = False
                    added += [NetworkRecoveryAnnounced(),
                              Notify(topic="network", level="recovered",
                                     text="network recovered")]
                continue
            streak = counted(streak, outage, self.targets.samples)
            if streak >= self.targets.samples:
                streak, announced = 0, True
                data = sample.data if isinstance(sample.data, dict) else {}
                failing = tuple(k.upper() for k in ("dns", "http")
                                if data.get(f"{k}_ok") is not None)
                added += [NetworkOutageAnnounced(failing=failing),
                          Notify(topic="network", level="outage",
                                 text=f"network outage: {' and '.join(failing)} failing")]
        return Decision([*effects, *streak_marks(self.name, before, streak), *added], tick_ms)


class ErrorEscalate(SurvivalRule):
    """Error-log matches: one digest (counts per pattern, the newest lines) at once, then at
    most one every `digest_every_s` while matches go on; patrol faster (`patrol_tick_ms`)
    for `patrol_for_s` after each.

    It counts from the error-log watcher's running totals, so a match is notified even when a
    quiet sample replaced it before the tick ran, and the lines held back by the rate limit
    are in the next digest.
    """

    name = "error_escalate"
    emits = (Notify,)

    def __init__(self, policy: ErrorLogPolicy) -> None:
        self.policy = policy

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        p = self.policy
        notice = ledger(curr).error_notice
        if notice is not None and curr.at - notice.at < p.patrol_for_s * 1000:
            tick_ms = min(tick_ms, p.patrol_tick_ms)
        totals = _newest_totals(curr)
        if totals is None:
            return Decision(effects, tick_ms)
        matches, by_pattern = _since(notice, totals)
        if matches <= 0:
            return Decision(effects, tick_ms)
        if notice is not None and curr.at < notice.at + p.digest_every_s * 1000:
            due = notice.at + p.digest_every_s * 1000 - curr.at
            return Decision(effects, min(tick_ms, max(due, 100)))  # held for the next digest
        newest = totals.latest[-min(matches, LATEST):]  # only lines after the last digest
        digest = Notify(topic="error-log", level="warning",
                        text=digest_text(matches, by_pattern), quoted=digest_quotes(newest))
        mark = ErrorsEscalated(at=curr.at, matches=matches, run=totals.run,
                               total=totals.matches, by_pattern=dict(totals.by_pattern))
        return Decision([*effects, digest, mark], min(tick_ms, p.patrol_tick_ms))


def _newest_totals(curr: Snapshot) -> ErrorTotals | None:
    """The error-log watcher's newest readable totals this engine sampled."""
    recent = list(curr.since_last_tick("error-log"))
    reading = curr.vital("error-log")
    if reading is not None:
        recent.insert(0, reading.sample)
    for sample in reversed(recent):
        totals = error_totals(sample.data) if sample.ok else None
        if totals is not None:
            return totals
    return None


def _since(notice: ErrorNotice | None, totals: ErrorTotals) -> tuple[int, dict[str, int]]:
    """The matching lines counted after the last digest, overall and per pattern: all of
    them when another watcher (before a restart or reload) counted up to that digest."""
    if notice is None or notice.run != totals.run:
        return totals.matches, {k: n for k, n in totals.by_pattern.items() if n > 0}
    grown = {k: n - notice.by_pattern.get(k, 0) for k, n in totals.by_pattern.items()}
    return totals.matches - notice.total, {k: n for k, n in grown.items() if n > 0}


DIGEST_PATTERNS = 8
DIGEST_LINE_CHARS = 200


def digest_text(matches: int, by_pattern: dict[str, int]) -> str:
    """One notice's text, bounded whatever the flood: the count and the busiest patterns
    (`DIGEST_PATTERNS`, each cut to 40 characters). The lines go in `digest_quotes`."""
    busiest = sorted(by_pattern.items(), key=lambda kv: (-kv[1], kv[0]))
    counts = ", ".join(f"{_cut(k, 40)} {n}" for k, n in busiest[:DIGEST_PATTERNS])
    if len(busiest) > DIGEST_PATTERNS:
        counts += f", {len(busiest) - DIGEST_PATTERNS} more patterns"
    return f"{matches} error lines in the logs ({counts})"


def digest_quotes(latest: Sequence[str]) -> tuple[Quote, ...]:
    """The newest lines (`LATEST`, each cut to `DIGEST_LINE_CHARS`) as quotes: a log line is
    text pulse passes on, never its own words."""
    return tuple(Quote(source="error-log", text=_cut(line, DIGEST_LINE_CHARS))
                 for line in latest[-LATEST:])


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"
