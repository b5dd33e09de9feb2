"""What the steps of one maintenance cycle share (CycleRun), and the cycles running now."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from pulse_adapters.maintenance._assessment import Assessment, Census, census
from pulse_adapters.maintenance._consolidation import Proposer
from pulse_adapters.maintenance._ledger import CYCLES_KEY, CycleBegan
from pulse_adapters.maintenance._report import Budget, CycleReport
from pulse_adapters.maintenance._settings import ORIGIN, PRINCIPAL, MaintenanceSettings
from pulse_core import Clock, Event, EventDraft, Projection, Projector
from pulse_core.maintenance import Activity, Authority, ElementsReader, SleepTask, read_activity
from pulse_core.store import AppendResult, EventStore

if TYPE_CHECKING:  # _work reads the task classes named here
    from pulse_adapters.maintenance._work import CycleTally

CYCLE_CLASS = "maintenance_cycle"
REVIEW_DERIVED = "review_derived"
WATCH_REVIEW = "watch_review"
HANDLED = frozenset({REVIEW_DERIVED, WATCH_REVIEW})
"""The sleep-task classes maintenance does when a task is unassigned."""
ABANDONED_AFTER = 4
"""A cycle still running this many attempt timeouts (`timeout_s`) after it began was
abandoned (its effect ran out of attempts): the next cycle ends it cancelled."""

S = TypeVar("S")


def claims(task: SleepTask, now_ms: int) -> bool:
    """Whether the sleep-task step claims `task` at `now_ms`: claimable, and assigned to
    maintenance or unassigned of a class it handles. The rule's backlog and watch triggers
    count only these, so a trigger never starts cycles for work maintenance never does."""
    return task.claimable(now_ms) and (
        task.assigned_to == PRINCIPAL or (not task.assigned_to and task.task_class in HANDLED))


class Folded:
    """Projection states caught up together, each reached by its projection."""

    def __init__(self, states: Mapping[str, Any]) -> None:
        self._states = states

    def __getitem__(self, projection: Projection[S]) -> S:
        state: S = self._states[projection.name]
        return state


@dataclass
class CycleRun:
    """What the steps of one cycle share: the store, the settings, the cycle's identity and
    start (and the seq of its activity-started, the cause of every event it writes), one
    elements reader, one budget, the last completed cycle's report, the tally of what the
    log holds of the cycle, the consolidation proposer (None: off), and what the report
    will say (deferred, needed authority, warnings...; the changes are read from the log,
    but for `changes`, counts that write nothing, such as skills_reviewed)."""

    store: EventStore
    settings: MaintenanceSettings
    cycle: str
    cycle_start: int
    trigger: str
    through_seq: int
    clock: Clock
    authority: Authority
    reader: ElementsReader
    budget: Budget
    previous: CycleReport | None
    work: CycleTally
    began_seq: int = 0
    proposer: Proposer | None = None
    changes: Counter[str] = field(default_factory=Counter)
    deferred: list[str] = field(default_factory=list)
    needed_authority: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    overdue: list[str] = field(default_factory=list)
    contested: list[str] = field(default_factory=list)
    assessment: Assessment = field(default_factory=Assessment)
    consumed_through: int = 0
    swept_at: int | None = None
    steps: list[str] = field(default_factory=list)
    _census: tuple[int, Census] | None = None
    _projectors: list[Projector] = field(default_factory=list)

    @property
    def now(self) -> int:
        """The time now (ms)."""
        return self.clock.now_ms()

    @property
    def cause(self) -> int | None:
        """The cause of every event this cycle writes: the seq of its activity-started."""
        return self.began_seq or None

    @property
    def abandoned_before(self) -> int:
        """Cycles that began before this time (ms) and still run were abandoned."""
        return self.cycle_start - int(ABANDONED_AFTER * self.settings.timeout_s * 1000)

    @property
    def closed_before(self) -> int | None:
        """Cycles that began before this time (ms) were closed by the last completed cycle
        (when it closed abandoned cycles without a warning): older ones need no reading.
        One attempt timeout of margin for clocks that disagree."""
        previous = self.previous
        if previous is None or any(w.startswith("close abandoned cycles")
                                   for w in previous.warnings):
            return None
        return previous.cycle_start - int((ABANDONED_AFTER + 1) * self.settings.timeout_s
                                          * 1000)

    @property
    def since_seq(self) -> int:
        """The log's newest seq when the last completed cycle began (0: never)."""
        return self.previous.through_seq if self.previous is not None else 0

    async def census(self) -> Census:
        """The elements' census as of this cycle's start (the time every review of one cycle
        judges by), over the log as it is now; computed again only when the log moved."""
        state = await self.reader.current()
        cursor = self.reader.cursor
        if self._census is None or self._census[0] != cursor:
            found = census(state, now=self.cycle_start,
                           archive_after_days=self.settings.retention.archive_after_days,
                           floor=self.settings.decay.floor,
                           import_origins=self.settings.imports.origins)
            self._census = (cursor, found)
        return self._census[1]

    async def fold(self, projection: Projection[S]) -> S:
        """`projection`'s state over the log as it is now, folded once per cycle: a later
        call folds only the events appended since (projection states are immutable)."""
        return (await self.folds(projection))[projection]

    async def folds(self, *projections: Projection[Any]) -> Folded:
        """The states of `projections` over the log as it is now, caught up together (one
        read of the log for them all), each folded once per cycle like `fold`'s."""
        names = {p.name for p in projections}
        projector = next((p for p in self._projectors
                          if names <= {q.name for q in p.projections}), None)
        if projector is None:
            projector = Projector(self.store, list(projections))
            self._projectors.append(projector)
        return Folded(await projector.catch_up())

    async def restored(self) -> frozenset[str]:
        """Element ids somebody restored from the archive: retention leaves them active
        (folded once per cycle, like `fold`)."""
        return await self.fold(Restored())

    async def append(self, drafts: Sequence[EventDraft],
                     expect: Mapping[str, int] | None = None) -> AppendResult:
        """Append `drafts` in one transaction and charge them to the budget."""
        result = await self.store.append(drafts, expect)
        if not result.replayed:
            self.budget.spend(writes=len(result.events), transactions=1)
        return result

    async def allowed(self, permission: str, action: str) -> bool:
        """Whether the maintenance principal holds `permission` now (read afresh); when it
        does not, `action` goes to the report's needed_authority."""
        if await self.authority.allows(PRINCIPAL, permission):
            return True
        note = f"{action} (needs {permission!r})"
        if note not in self.needed_authority:
            self.needed_authority.append(note)
        return False


Step = Callable[[CycleRun], Awaitable[None]]


CYCLES_PAGE = 16
"""How many of the newest `maintenance-cycle-began` events cycles_began reads first."""


async def cycles_began(store: EventStore, *, since_ms: int | None = None
                       ) -> AsyncIterator[tuple[Event, CycleBegan]]:
    """Every cycle maintenance began, newest first, with its `maintenance-cycle-began` event;
    only those on their key from maintenance's origin are cycles (see the ledger). Stops at
    the first that began before `since_ms`. The log is read a few of the newest at a time,
    more each time it runs on, so a caller that stops early does not read every cycle ever
    begun; one that began during the walk is not in it."""
    limit = CYCLES_PAGE
    below: int | None = None  # the seq of the last event walked: the walk goes on below it
    while True:
        events = await store.read(key=CYCLES_KEY, kinds=["maintenance-cycle-began"],
                                  newest_first=True, limit=limit)
        for event in events:
            if below is not None and event.seq >= below:
                continue
            below = event.seq
            if event.origin != ORIGIN:
                continue
            began = event.payload(CycleBegan)
            if since_ms is not None and began.cycle_start < since_ms:
                return
            yield event, began
        if len(events) < limit:
            return
        limit *= 4


async def running_before(store: EventStore, before_ms: int, *, since_ms: int | None = None
                         ) -> list[Activity]:
    """Cycles that began before `before_ms` (and at or after `since_ms`: older ones were
    closed by an earlier cycle) and are still running, newest first. Only the activities in
    that window are read, so a cycle's cost does not grow with every cycle ever begun."""
    found: list[Activity] = []
    async for _, began in cycles_began(store, since_ms=since_ms):
        if began.cycle_start >= before_ms:
            continue
        activity = await read_activity(store, began.cycle)
        if activity is not None and activity.status == "running":
            found.append(activity)
    return found


SWEPT_LOOKBACK = 1_000
"""How many of the newest `memory-metabolized` events last_swept looks through for one
written by maintenance."""


async def last_swept(store: EventStore) -> int | None:
    """The `cycle_start` of the newest sweep maintenance wrote (its newest
    `memory-metabolized` from origin executor:maintenance), clamped to that event's own time,
    or None. Read from the log, so a cycle that swept counts however it ended (completed,
    failed, abandoned, or still running in another process)."""
    newest = await store.read(kinds=["memory-metabolized"], newest_first=True, limit=1)
    if newest and newest[0].origin != ORIGIN:  # rare: somebody else wrote the newest one
        newest = await store.read(kinds=["memory-metabolized"], newest_first=True,
                                  limit=SWEPT_LOOKBACK)
    for event in newest:
        if event.origin != ORIGIN or not isinstance(event.data, dict):
            continue
        start = event.data.get("cycle_start")
        if isinstance(start, int) and not isinstance(start, bool):
            return min(start, event.ts)
    return None


async def overlapping_cycles(store: EventStore, began_seq: int, *, since_ms: int
                             ) -> list[Activity]:
    """Other cycles that began before seq `began_seq` (at or after `since_ms`) and had not
    ended by then: cycles overlapping the one that began at `began_seq`, earlier ones."""
    found: list[Activity] = []
    async for event, began in cycles_began(store, since_ms=since_ms):
        if event.seq >= began_seq:
            continue
        activity = await read_activity(store, began.cycle)
        if activity is not None and (activity.status == "running" or activity.seq > began_seq):
            found.append(activity)
    return found


async def fold(store: EventStore, projection: Projection[S]) -> S:
    """`projection`'s state over the log as it is now, folded afresh."""
    states: dict[str, Any] = await Projector(store, [projection]).catch_up()
    state: S = states[projection.name]
    return state


class Restored(Projection[frozenset[str]]):
    """Element ids somebody restored from the archive (`element-restored`)."""

    name = "maintenance-restored"
    kinds = frozenset({"element-restored"})

    def initial(self) -> frozenset[str]:
        return frozenset()

    def apply(self, state: frozenset[str], event: Event) -> frozenset[str]:
        if not isinstance(event.data, dict):
            return state
        return state | {f"{event.key.removeprefix('identity:')}/{event.data.get('record')}"}
