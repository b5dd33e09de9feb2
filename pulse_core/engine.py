"""The Engine: stores, watchers, the rule chain and the executor loop, in one asyncio program."""

from __future__ import annotations

import asyncio
import contextlib
import os
import traceback
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

from pulse_core.clock import Clock, SystemClock
from pulse_core.effects import Executor, effect_draft
from pulse_core.errors import PulseError, SurvivalLocked
from pulse_core.events import EventDraft
from pulse_core.executor_loop import ExecutorLoop
from pulse_core.homelock import lock_home
from pulse_core.memory import Memory
from pulse_core.projections import RecentErrors
from pulse_core.rules import (
    Decision,
    Inner,
    Rule,
    clamp_tick,
    compose,
    dedup,
    error_backoff,
    guarded,
    rule_name,
)
from pulse_core.snapshot import Projection, Projector, Snapshot, VitalReading
from pulse_core.store.base import AppendResult
from pulse_core.store.events import SqliteEventStore
from pulse_core.store.objects import ObjectStore
from pulse_core.store.vitals import Retention, VitalsStore
from pulse_core.tasks import AgentCapabilityStats, PendingTasks, Tasks
from pulse_core.watch import Watcher, sample_once, watch_forever

if TYPE_CHECKING:
    from pulse_survival import EngineDirectory, SurvivalConfig, SurvivalLayer


def default_builtin_rules() -> list[Rule]:
    """The built-in rules every engine runs between the survival layer and user rules."""
    return [clamp_tick(), error_backoff(), dedup()]


def _survival_layer(config: SurvivalConfig | None, home: Path,
                    directory: EngineDirectory | None) -> SurvivalLayer:
    from pulse_survival import SurvivalConfig, survival_layer

    if config is None:
        config = SurvivalConfig()
    if not isinstance(config, SurvivalConfig):
        raise SurvivalLocked(
            f"survival={config!r}: the survival layer cannot be switched off or replaced; "
            "tune it with a pulse_survival.SurvivalConfig"
        )
    return survival_layer(config, home, directory)


class Engine:
    """One agent's nervous system on one home folder.

    The rule chain is fixed as: survival rules (outermost, from pulse_survival, not removable),
    the built-in rules, then `rules` in the order given. Every rule is guarded: an exception
    becomes an `error` event and the tick passes through it. The business rules together get
    `rule_timeout` seconds a tick; past it their decision is dropped (an `error` event) and
    the survival rules decide alone.
    """

    def __init__(
        self,
        home: str | Path,
        *,
        watchers: Sequence[Watcher] = (),
        rules: Sequence[Rule] = (),
        executors: Sequence[Executor] = (),
        projections: Sequence[Projection[Any]] = (),
        clock: Clock | None = None,
        default_tick_ms: int = 5_000,
        builtin_rules: Sequence[Rule] | None = None,
        executor_concurrency: int = 8,
        executor_scan_interval: float = 1.0,
        synchronous: str = "FULL",
        drain_timeout: float = 10.0,
        retention: Retention | None = None,
        survival: SurvivalConfig | None = None,
        engine_directory: EngineDirectory | None = None,
        rule_timeout: float = 2.0,
    ) -> None:
        self.home = Path(home).expanduser()
        self.clock: Clock = clock or SystemClock()
        layer = _survival_layer(survival, self.home, engine_directory)
        self._survival_names = {rule_name(r) for r in layer.rules}
        self._check_not_survival([*rules, *(builtin_rules or ())])
        self.watchers = [*layer.watchers, *watchers]
        self.executors = [*layer.executors, *executors]
        self.projection_list: list[Projection[Any]] = [
            Tasks(), PendingTasks(), AgentCapabilityStats(), RecentErrors(), Memory(),
            *layer.projections,
            *projections,
        ]
        self.rule_timeout = rule_timeout
        self.default_tick_ms = default_tick_ms
        self.executor_concurrency = executor_concurrency
        self.executor_scan_interval = executor_scan_interval
        self.synchronous = synchronous
        self.drain_timeout = drain_timeout
        self.retention = retention or Retention()
        builtins = default_builtin_rules() if builtin_rules is None else list(builtin_rules)
        self._tick_errors: list[tuple[str, BaseException]] = []
        chain = [guarded(r, self._rule_error) for r in (*layer.rules, *builtins)]
        self._chain: Inner = compose([*chain, self._time_boxed()], default_tick_ms)
        self._fixed_names = tuple(rule_name(r) for r in (*layer.rules, *builtins))
        self._business: Inner = self._compose_business(rules)
        self.rule_names: tuple[str, ...] = (*self._fixed_names, *map(rule_name, rules))
        self._lock_file: IO[str] | None = None
        self._events: SqliteEventStore | None = None
        self._vitals: VitalsStore | None = None
        self.objects: ObjectStore | None = None
        self._projector: Projector | None = None
        self._executor_loop: ExecutorLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._background: set[asyncio.Task[Any]] = set()
        self._wake = asyncio.Event()
        self._tick_lock = asyncio.Lock()
        self._prev: Snapshot | None = None
        self._last_tick_ms = default_tick_ms
        self._tick_number = 0
        self._last_tick_at: int | None = None

    # -- parts, available once open ----------------------------------------------------------

    @property
    def events(self) -> SqliteEventStore:
        """events.db."""
        if self._events is None:
            raise PulseError("engine is not open: use `async with engine:` or `await open()`")
        return self._events

    @property
    def vitals(self) -> VitalsStore:
        """vitals.db."""
        if self._vitals is None:
            raise PulseError("engine is not open: use `async with engine:` or `await open()`")
        return self._vitals

    @property
    def ticks(self) -> int:
        """How many ticks this engine has run since it was built."""
        return self._tick_number

    @property
    def last_tick_at(self) -> int | None:
        """When (engine clock, ms) the last tick took its snapshot; None before the first."""
        return self._last_tick_at

    @property
    def last_tick_ms(self) -> int:
        """The interval the last tick chose (the default before the first)."""
        return self._last_tick_ms

    @property
    def executor_loop(self) -> ExecutorLoop:
        """The loop that runs effects."""
        if self._executor_loop is None:
            raise PulseError("engine is not open: use `async with engine:` or `await open()`")
        return self._executor_loop

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Lock the home, open the stores, load checkpoints and fold the log up to now."""
        self._lock_file = lock_home(self.home)
        try:
            self.objects = ObjectStore(self.home / "objects")
            self._events = await SqliteEventStore.open(
                self.home / "events.db", synchronous=self.synchronous, clock=self.clock,
                objects=self.objects,
            )
            self._vitals = await VitalsStore.open(self.home / "vitals.db", clock=self.clock)
            checkpoints = self.home / "checkpoints"
            self._projector = Projector(self._events, self.projection_list,
                                        checkpoints=checkpoints)
            self._executor_loop = ExecutorLoop(
                self._events, self.executors, clock=self.clock,
                concurrency=self.executor_concurrency, scan_interval=self.executor_scan_interval,
                checkpoints=checkpoints,
            )
            await self._projector.catch_up()
            await self._executor_loop.refresh()
            await self._events.append([EventDraft(
                "engine-started", "engine", {"pid": os.getpid(),
                                             "owner": self._executor_loop.owner},
                origin="engine")])
        except BaseException:
            await self._close_stores()
            raise

    async def start(self) -> None:
        """Start the watcher, tick and executor loops."""
        for watcher in self.watchers:
            self._tasks.append(asyncio.create_task(
                watch_forever(watcher, self.vitals, self.wake, self._background_error),
                name=f"pulse-watcher-{watcher.name}"))
        self._tasks.append(asyncio.create_task(self._tick_loop(), name="pulse-tick"))
        self._tasks.append(asyncio.create_task(self.executor_loop.run(), name="pulse-executors"))
        self._tasks.append(asyncio.create_task(self._housekeeping(), name="pulse-housekeeping"))

    async def __aenter__(self) -> Engine:
        await self.open()
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop ticking, drain effects in flight up to `drain_timeout`, close the stores.

        Attempts still running at the deadline are interrupted and recorded as retryable
        failures, so the next engine on this home runs them again.
        """
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        for watcher in self.watchers:
            with contextlib.suppress(Exception):
                await watcher.aclose()
        if self._executor_loop is not None and self._events is not None:
            interrupted = await self._executor_loop.drain(self.drain_timeout)
            if self._background:
                await asyncio.gather(*self._background, return_exceptions=True)
            if self._projector is not None:
                await self._projector.checkpoint()
            with contextlib.suppress(PulseError):
                await self._events.append([EventDraft(
                    "engine-stopped", "engine", {"pid": os.getpid(), "interrupted": interrupted},
                    origin="engine")])
        await self._close_stores()

    async def _close_stores(self) -> None:
        if self._events is not None:
            await self._events.close()
            self._events = None
        if self._vitals is not None:
            await self._vitals.close()
            self._vitals = None
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None

    # -- the agent's side --------------------------------------------------------------------

    async def append(
        self, drafts: Sequence[EventDraft], expect: Mapping[str, int] | None = None
    ) -> AppendResult:
        """Append events to the log (human messages, tasks...) in one transaction."""
        return await self.events.append(drafts, expect)

    def wake(self) -> None:
        """Ask for a tick now; many wakes during one tick give one more tick, not many."""
        self._wake.set()

    # -- ticking -----------------------------------------------------------------------------

    def _check_not_survival(self, rules: Sequence[Rule]) -> None:
        for rule in rules:
            if rule_name(rule) in self._survival_names:
                raise SurvivalLocked(
                    f"rule {rule_name(rule)!r} is a survival rule: it is always present, "
                    "outermost, in a fixed order, and cannot be added, removed or reordered"
                )

    def _compose_business(self, rules: Sequence[Rule]) -> Inner:
        return compose([guarded(r, self._rule_error) for r in rules], self.default_tick_ms)

    async def replace_rules(self, rules: Sequence[Rule]) -> None:
        """Swap the business rules, atomically between two ticks.

        The survival and built-in rules are never replaced. A chain that fails to compose
        raises here and the old one keeps running.
        """
        self._check_not_survival(rules)
        business = self._compose_business(rules)
        async with self._tick_lock:
            self._business = business
            self.rule_names = (*self._fixed_names, *map(rule_name, rules))

    def _time_boxed(self) -> Rule:
        async def business_rules(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
            try:
                async with asyncio.timeout(self.rule_timeout):
                    return await self._business(prev, curr)
            except TimeoutError:
                self._rule_error("business-rules", TimeoutError(
                    f"business rules took longer than {self.rule_timeout:g} s; their decision "
                    "was dropped for this tick"))
                return await inner(prev, curr)

        return business_rules

    def _rule_error(self, rule: str, exc: BaseException) -> None:
        self._tick_errors.append((f"rule:{rule}", exc))

    def _background_error(self, where: str, exc: BaseException) -> None:
        task = asyncio.create_task(self.events.append([_error_draft(where, exc)]))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def snapshot(self) -> Snapshot:
        """The world as the next tick will see it."""
        assert self._projector is not None
        states = await self._projector.catch_up()
        await self.executor_loop.refresh()
        vitals = await self.vitals.latest()
        now = self.clock.now_ms()
        return Snapshot(
            seq=self._projector.seq, at=now, number=self._tick_number + 1,
            vitals={k: VitalReading(s, now - s.ts) for k, s in vitals.items()},
            projections=states, pending_effects=self.executor_loop.pending_dedup_keys(),
            last_tick_ms=self._last_tick_ms,
        )

    async def tick(self) -> Decision:
        """Run the rule chain once; record its effects, errors and a tick record together."""
        async with self._tick_lock:
            curr = await self.snapshot()
            prev = self._prev or _first_prev(curr)
            self._tick_errors = []
            decision = await self._chain(prev, curr)
            errors, self._tick_errors = self._tick_errors, []
            drafts = [effect_draft(e, origin="engine:tick", cause=curr.seq or None)
                      for e in decision.effects]
            drafts += [_error_draft(where, exc) for where, exc in errors]
            if drafts:
                drafts.append(EventDraft(
                    "tick", "engine", {"number": curr.number, "tick_ms": decision.tick_ms,
                                       "effects": [d.key for d in drafts if d.kind == "effect"],
                                       "errors": len(errors), "seen_seq": curr.seq},
                    origin="engine"))
                await self.events.append(drafts)
            self._prev = curr
            self._tick_number = curr.number
            self._last_tick_ms = decision.tick_ms
            self._last_tick_at = curr.at
            return decision

    async def step(self) -> Decision:
        """One collect of every watcher, one tick, then executors until idle. For tests."""
        for watcher in self.watchers:
            await sample_once(watcher, self.vitals)
        decision = await self.tick()
        await self.executor_loop.run_until_idle()
        return decision

    async def _tick_loop(self) -> None:
        while True:
            try:
                decision = await self.tick()
                tick_s = decision.tick_ms / 1000
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                self._background_error("engine:tick", exc)
                tick_s = self.default_tick_ms / 1000
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(tick_s):
                    await self._wake.wait()
            self._wake.clear()

    async def _housekeeping(self, every: float = 60.0) -> None:
        while True:
            await asyncio.sleep(every)
            try:
                await self.vitals.gc(self.retention)
            except Exception as exc:
                self._background_error("engine:vitals-gc", exc)


def _first_prev(curr: Snapshot) -> Snapshot:
    """The `prev` of a first tick: nothing seen yet, at the same moment."""
    return Snapshot(seq=0, at=curr.at, number=0, vitals={}, projections=curr.projections,
                    last_tick_ms=curr.last_tick_ms)


def _error_draft(where: str, exc: BaseException) -> EventDraft:
    return EventDraft(
        "error", where,
        {"where": where, "type": type(exc).__name__, "message": str(exc),
         "trace": "".join(traceback.format_exception(exc)[-3:])[-2000:]},
        origin="engine" if where.startswith("engine") else where,
    )
