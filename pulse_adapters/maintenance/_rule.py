"""The maintenance rule: fast and deterministic, in the tick. It reads only the snapshot (the
maintenance ledger, the schedules, sleep tasks and watches folded from the log), decides whether
a cycle is due, emits one `MaintenanceCycle` effect (deduplicated: one cycle at a time, across
engines sharing the log) and returns a tick hint so the tick wakes when the next one is due.
"""

from __future__ import annotations

from typing import ClassVar

from pulse_adapters.maintenance._context import claims
from pulse_adapters.maintenance._ledger import LedgerState, MaintenanceLedger
from pulse_adapters.maintenance._settings import MaintenanceSettings, ScheduleSettings
from pulse_core import Decision, Effect, Inner, Snapshot
from pulse_core.maintenance import (
    DailyAt,
    Every,
    Schedules,
    SchedulesState,
    SleepTasks,
    Watches,
    next_due,
)

SCHEDULE_NAME = "maintenance"
DEDUP = "maintenance-cycle"
TRIGGERS = ("scheduled", "on-demand", "post-session", "backlog", "watch")


class MaintenanceCycle(Effect, tag="maintenance-cycle"):
    """Run one maintenance cycle. `trigger` says why (scheduled, on-demand, post-session,
    backlog, watch); `due_at` is the schedule's due time for a scheduled one. Any engine
    sharing the log may run it, one at a time (the dedup key is constant)."""

    any_host: ClassVar[bool] = True

    trigger: str = "on-demand"
    reason: str = ""
    due_at: int | None = None

    def dedup_key(self) -> str:
        return DEDUP


def schedule_of(schedule: ScheduleSettings) -> Every | DailyAt | None:
    """The pulse_core schedule the settings describe (None: no scheduled cycles)."""
    if schedule.daily_at is not None:
        return DailyAt(SCHEDULE_NAME, schedule.daily_at, tz=schedule.tz)
    if schedule.every_h is not None:
        low, high = schedule.every_h
        return Every(SCHEDULE_NAME, low * 3600, high * 3600)
    return None


class MaintenanceRule:
    """Decorates: runs the rules inside it, then adds a MaintenanceCycle when one is due.

    In order: on demand (a `maintenance-requested` since the last cycle began), the
    schedule, a watch (a change matched an armed delta watch since the last cycle began, a
    silence watch past due, or a fired watch's review task maintenance would claim), a
    backlog of sleep tasks maintenance would claim (`claims`, the predicate the sleep-task
    step uses), a long session. All but on-demand wait `min_gap_s` after the last
    cycle began; no trigger is emitted again within `min_gap_s` of this rule's last emission when
    no cycle began since (its effect failed before beginning).
    """

    name = "maintenance"
    emits: ClassVar[tuple[type[Effect], ...]] = (MaintenanceCycle,)

    def __init__(self, settings: MaintenanceSettings | None = None) -> None:
        self.settings = settings or MaintenanceSettings()
        self.schedule = schedule_of(self.settings.schedule)
        self._emitted: tuple[int, int] | None = None  # (when, cycles begun then)
        # the last states read and what they said: a tick whose states did not move reads
        # nothing again (projection states are immutable, so identity is enough)
        self._tasks: tuple[object, int, str, int] | None = None
        self._watches: tuple[object, int | None, str] | None = None

    async def __call__(self, prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        if not {MaintenanceLedger.name, Schedules.name} <= curr.projections.keys():
            return Decision(effects, tick_ms)  # a snapshot from an engine without the layer
        cycle, wait_ms = self.due(curr)
        if cycle is not None:
            effects = [*effects, cycle]
        if wait_ms is not None:
            tick_ms = min(tick_ms, max(1_000, wait_ms))
        return Decision(effects, tick_ms)

    def due(self, curr: Snapshot) -> tuple[MaintenanceCycle | None, int | None]:
        """The cycle to start now (or None) and the ms until the next one may be due."""
        now = curr.at
        ledger = curr.state(MaintenanceLedger)
        schedules = curr.state(Schedules)
        scheduled_at = self._scheduled_at(schedules, now)
        silence_at = self._silence_at(curr)
        wait = [t - now for t in (scheduled_at, silence_at) if t is not None and t > now]
        wait_ms = min(wait, default=None)
        if DEDUP in curr.pending_effects:
            return None, wait_ms  # one cycle at a time: it is pending or running
        gap_ms = int(self.settings.triggers.min_gap_s * 1000)
        if self._emitted is not None and self._emitted[1] == ledger.cycles \
                and now - self._emitted[0] < gap_ms:
            return None, min(self._emitted[0] + gap_ms - now, wait_ms or gap_ms)
        cycle = self._trigger(curr, ledger, scheduled_at, now, gap_ms)
        if cycle is not None:
            self._emitted = (now, ledger.cycles)
        return cycle, wait_ms

    def _trigger(self, curr: Snapshot, ledger: LedgerState, scheduled_at: int | None,
                 now: int, gap_ms: int) -> MaintenanceCycle | None:
        triggers = self.settings.triggers
        if triggers.on_demand and ledger.requested:
            return MaintenanceCycle(trigger="on-demand", reason=ledger.last_request_reason)
        rested = ledger.last_cycle_start is None or now - ledger.last_cycle_start >= gap_ms
        if not rested:
            return None
        if scheduled_at is not None and scheduled_at <= now:
            return MaintenanceCycle(trigger="scheduled", due_at=scheduled_at,
                                    reason=f"schedule {SCHEDULE_NAME!r} due")
        if triggers.watches:
            why = self._watch_reason(curr, ledger, now)
            if why:
                return MaintenanceCycle(trigger="watch", reason=why)
        if triggers.backlog and SleepTasks.name in curr.projections:
            pending = self._sleep(curr)[0]
            if pending >= triggers.backlog:
                return MaintenanceCycle(trigger="backlog",
                                        reason=f"{pending} sleep tasks for maintenance")
        if triggers.post_session_exchanges and \
                ledger.most_exchanges >= triggers.post_session_exchanges:
            busiest = max(ledger.exchanges, key=lambda i: ledger.exchanges[i])
            return MaintenanceCycle(trigger="post-session", reason=(
                f"{ledger.most_exchanges} human exchanges with {busiest} since the last "
                "cycle"))
        return None

    def _scheduled_at(self, schedules: SchedulesState, now: int) -> int | None:
        if self.schedule is None:
            return None
        return next_due(self.schedule, schedules, now)

    def _sleep(self, curr: Snapshot) -> tuple[int, str]:
        """(sleep tasks the sleep-task step would claim now, the first of them a watch fire
        made, or "")."""
        tasks = curr.state(SleepTasks)
        if self._tasks is None or self._tasks[0] is not tasks or self._tasks[3] != curr.at:
            mine = [t for t in tasks.values() if claims(t, curr.at)]
            fired = next((t.id for t in mine if t.id.startswith("watch_fire:")), "")
            self._tasks = (tasks, len(mine), fired, curr.at)
        return self._tasks[1], self._tasks[2]

    def _watch_state(self, curr: Snapshot) -> tuple[int | None, str]:
        """(the soonest due time of an armed silence watch, and that watch's id)."""
        watches = curr.state(Watches)
        if self._watches is None or self._watches[0] is not watches:
            silences = [w for w in watches.values()
                        if w.status == "armed" and w.spec.due_at is not None]
            soonest = min(silences, key=lambda w: (w.spec.due_at or 0, w.armed_seq),
                          default=None)
            self._watches = (watches, None if soonest is None else soonest.spec.due_at,
                             "" if soonest is None else soonest.id)
        return self._watches[1], self._watches[2]

    def _silence_at(self, curr: Snapshot) -> int | None:
        """The soonest due time of an armed silence watch (the tick wakes for it)."""
        if not self.settings.triggers.watches or Watches.name not in curr.projections:
            return None
        return self._watch_state(curr)[0]

    def _watch_reason(self, curr: Snapshot, ledger: LedgerState, now: int) -> str:
        if ledger.matched:
            return f"delta watch {ledger.matched[0]} matched a change"
        if Watches.name in curr.projections:
            due, watch = self._watch_state(curr)
            if due is not None and due <= now:
                return f"silence watch {watch} is past due"
        if SleepTasks.name in curr.projections:
            fired = self._sleep(curr)[1]
            if fired:
                return f"watch fired: task {fired} awaits review"
        return ""
