"""resource_guard, network_watchdog and error_escalate: pressure, outages, error storms."""

from __future__ import annotations

from pulse_core import Decision, Effect, Inner, Snapshot
from pulse_survival.config import ErrorLogPolicy, NetworkTargets, ResourceThresholds
from pulse_survival.effects import ArchiveSessions, Cleanup, Notify
from pulse_survival.rules.base import Streak, SurvivalRule, latest, ledger
from pulse_survival.watchers import network_outage, under_pressure


class ResourceGuard(SurvivalRule):
    """Memory or disk over threshold for `samples` samples: archive old sessions and clean up;
    while under pressure, tick every `pressure_tick_ms`."""

    name = "resource_guard"

    def __init__(self, policy: ResourceThresholds) -> None:
        self.policy = policy
        self._streak = Streak()

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        sample = latest(curr, "system-resource")
        if sample is None or not sample.ok:
            return Decision(effects, tick_ms)
        pressure = under_pressure(sample.data, self.policy.memory_pct, self.policy.disk_pct)
        if not pressure:
            self._streak.feed(sample, False)
            return Decision(effects, tick_ms)
        tick_ms = min(tick_ms, self.policy.pressure_tick_ms)
        if self._streak.feed(sample, True) < self.policy.samples:
            return Decision(effects, tick_ms)
        self._streak.fired()
        p = self.policy
        added: list[Effect] = []
        if p.session_folders:
            added.append(ArchiveSessions(folders=p.session_folders, archive_to=p.archive_to,
                                         older_than_s=p.older_than_s,
                                         max_files=p.max_files_per_run))
        added.append(Cleanup(folders=p.temp_folders, archive_to=p.archive_to,
                             older_than_s=p.older_than_s, max_files=p.max_files_per_run))
        return Decision([*effects, *added], tick_ms)


class NetworkWatchdog(SurvivalRule):
    """Every configured probe kind failing (DNS and HTTP both, when both are configured) for
    `samples` samples: one notice per outage, one on recovery."""

    name = "network_watchdog"

    def __init__(self, targets: NetworkTargets) -> None:
        self.targets = targets
        self._down = Streak()
        self._up = Streak()

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        sample = latest(curr, "network")
        if sample is None or not sample.ok:
            return Decision(effects, tick_ms)
        outage = network_outage(sample.data)
        down = self._down.feed(sample, outage)
        up = self._up.feed(sample, not outage)
        announced = ledger(curr).network_down
        if outage and not announced and down >= self.targets.samples:
            self._down.fired()
            kinds = " and ".join(k.upper() for k in ("dns", "http")
                                 if isinstance(sample.data, dict)
                                 and sample.data.get(f"{k}_ok") is not None)
            return Decision([*effects, Notify(topic="network", level="outage",
                                              text=f"network outage: {kinds} failing")],
                            tick_ms)
        if not outage and announced and up >= 1:
            return Decision([*effects, Notify(topic="network", level="recovered",
                                              text="network recovered")], tick_ms)
        return Decision(effects, tick_ms)


class ErrorEscalate(SurvivalRule):
    """Error-log matches: notify, and patrol faster (`patrol_tick_ms`) for `patrol_for_s`."""

    name = "error_escalate"

    def __init__(self, policy: ErrorLogPolicy) -> None:
        self.policy = policy
        self._last_seen: int | None = None

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        last = ledger(curr).last_escalation
        if last is not None and curr.at - last < self.policy.patrol_for_s * 1000:
            tick_ms = min(tick_ms, self.policy.patrol_tick_ms)
        sample = latest(curr, "error-log")
        if sample is None or not sample.ok or sample.ts == self._last_seen:
            return Decision(effects, tick_ms)
        first_look = self._last_seen is None
        self._last_seen = sample.ts
        if first_look and last is not None and sample.ts <= last:
            # a new engine on this home: an escalation at or after this sample was already
            # recorded (by an earlier engine), so the sample is not news
            return Decision(effects, tick_ms)
        matches = int(sample.data.get("matches", 0)) if isinstance(sample.data, dict) else 0
        if not matches:
            return Decision(effects, tick_ms)
        examples = "; ".join(sample.data.get("examples", [])[:3])
        notice = Notify(topic="error-log", level="warning",
                        text=f"{matches} error lines in the logs (at {sample.ts}): {examples}")
        return Decision([*effects, notice], min(tick_ms, self.policy.patrol_tick_ms))
