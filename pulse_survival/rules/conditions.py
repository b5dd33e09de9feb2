"""resource_guard, network_watchdog and error_escalate: pressure, outages, error storms."""

from __future__ import annotations

from pulse_core import Decision, Effect, Inner, Snapshot
from pulse_survival.config import ErrorLogPolicy, NetworkTargets, ResourceThresholds
from pulse_survival.effects import ArchiveSessions, Cleanup, Notify
from pulse_survival.marks import ErrorsEscalated, NetworkOutageAnnounced, NetworkRecoveryAnnounced
from pulse_survival.rules.base import SurvivalRule, counted, latest, ledger, streak_marks
from pulse_survival.watchers import network_outage, under_pressure


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
    """Error-log matches: notify, and patrol faster (`patrol_tick_ms`) for `patrol_for_s`.

    Every error-log sample since the last tick counts, so a match is notified even when a
    quiet sample replaced it before the tick ran.
    """

    name = "error_escalate"
    emits = (Notify,)

    def __init__(self, policy: ErrorLogPolicy) -> None:
        self.policy = policy

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        last = ledger(curr).last_escalation
        if last is not None and curr.at - last < self.policy.patrol_for_s * 1000:
            tick_ms = min(tick_ms, self.policy.patrol_tick_ms)
        matching = [s for s in curr.since_last_tick("error-log")
                    if s.ok and isinstance(s.data, dict) and int(s.data.get("matches", 0))]
        if not matching:
            return Decision(effects, tick_ms)
        matches = sum(int(s.data["matches"]) for s in matching)
        examples = "; ".join([str(x) for s in matching for x in s.data.get("examples", [])][:3])
        notice = Notify(topic="error-log", level="warning",
                        text=f"{matches} error lines in the logs (at {matching[-1].ts}): "
                             f"{examples}")
        return Decision([*effects, notice, ErrorsEscalated(at=curr.at, matches=matches)],
                        min(tick_ms, self.policy.patrol_tick_ms))
