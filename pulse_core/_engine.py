"""The Engine: a home's stores, its layers' watchers, rules, executors and services, in one
asyncio program, every loop under one supervisor."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from pulse_core._assembly import assemble, check_not_survival, default_builtin_rules
from pulse_core._clock import Clock, SystemClock
from pulse_core._effects import Executor
from pulse_core._error_reports import ErrorReports
from pulse_core._errors import PulseError
from pulse_core._events import EventDraft
from pulse_core._executor_loop import ExecutorLoop
from pulse_core._fleet import EngineHeartbeat, LoopBeat, heartbeats, installed_version
from pulse_core._home import HomeLayout, HomeStores, open_home
from pulse_core._homelock import lock_home
from pulse_core._housekeeping import housekeeping, save_memo
from pulse_core._instruments import InstrumentFanOut, Instruments
from pulse_core._layer import EngineDirectory, Layer, enter_lifespan
from pulse_core._principals import Principal
from pulse_core._projector import Projector
from pulse_core._recent_errors import SERVICE_PREFIX
from pulse_core._rules import Decision, Rule, RuleTrace, rule_name
from pulse_core._run import stop_signals
from pulse_core._snapshot import Projection, Snapshot
from pulse_core._supervisor import LoopStatus, Once, Supervisor, wait_signal
from pulse_core._ticker import Ticker
from pulse_core._watchers import Watcher, sample_once, watch_forever
from pulse_core.store import (
    AppendResult,
    EventStore,
    ObjectStore,
    Retention,
    SideStore,
    VitalsStore,
)

__all__ = ["Engine", "default_builtin_rules"]  # the second is re-exported from _assembly

T = TypeVar("T")


class Engine:
    """One agent's nervous system on one home folder.

    The chain is fixed as: the survival layer's rules (outermost, found through the
    `pulse.survival` entry point, never removable), the built-in rules, each of `layers`'
    rules in the order given, then the business layer's rules (the engine directory's code,
    or `rules=`), which together get `rule_timeout` seconds a tick. Every rule is guarded: an
    exception becomes an `error` event and the tick passes through it.

    `watchers`, `rules`, `executors` and `projections` are a shorthand for
    `business=Layer("business", ...)`. `store` is a store URL (default: the home's own
    events.db); `side_store` a side-store URL (default: the home's own state.db; redis://
    or valkey:// for a fleet); `survival` is handed to the survival layer (a
    pulse_survival.SurvivalConfig, a config mapping, or None for its defaults).
    `host` names this engine's machine in its effect claims (default: its hostname; see
    ExecutorLoop); `principal` holds its handle on the log (default: the person running
    it; executors always write as the engine, see Principal).
    """

    def __init__(
        self,
        home: str | Path,
        *,
        layers: Sequence[Layer] = (),
        business: Layer | None = None,
        watchers: Sequence[Watcher] = (),
        rules: Sequence[Rule] = (),
        executors: Sequence[Executor] = (),
        projections: Sequence[Projection[Any]] = (),
        store: str | None = None,
        side_store: str | None = None,
        clock: Clock | None = None,
        default_tick_ms: int = 5_000,
        builtin_rules: Sequence[Rule] | None = None,
        executor_concurrency: int = 8,
        executor_scan_interval: float = 1.0,
        drain_timeout: float = 10.0,
        retention: Retention | None = None,
        survival: Any = None,
        engine_directory: EngineDirectory | None = None,
        rule_timeout: float = 2.0,
        host: str | None = None,
        principal: Principal | None = None,
        heartbeat_s: float = 60.0,
    ) -> None:
        if not 0 < heartbeat_s < 86_400:
            raise PulseError(f"heartbeat_s={heartbeat_s!r}: give seconds between 0 and 86400 "
                             "(default 60)")
        self.layout = HomeLayout.at(home)
        self.principal = principal
        self.home = self.layout.root
        self.clock: Clock = clock or SystemClock()
        self.store_url = store
        self.side_store_url = side_store
        self.host = host
        parts = assemble(
            self.home, self.clock, layers=layers, business=business, watchers=watchers,
            rules=rules, executors=executors, projections=projections,
            builtin_rules=default_builtin_rules() if builtin_rules is None else builtin_rules,
            store=store, host=host, survival=survival, engine_directory=engine_directory,
            default_tick_ms=default_tick_ms, rule_timeout=rule_timeout)
        #: the host what this engine decides is bound to, where engines of several hosts
        #: share its log ('' for a log of its own: nothing to bind)
        self.placement = parts.placement
        self.survival = parts.survival
        self.layers: tuple[Layer, ...] = parts.layers
        self.business = parts.business
        self.watchers: list[Watcher] = list(parts.watchers)
        self.executors: list[Executor] = list(parts.executors)
        self.projection_list: list[Projection[Any]] = list(parts.projections)
        self.chain = parts.chain
        self.rule_timeout = rule_timeout
        self.default_tick_ms = default_tick_ms
        self.executor_concurrency = executor_concurrency
        self.executor_scan_interval = executor_scan_interval
        self.drain_timeout = drain_timeout
        self.heartbeat_s = heartbeat_s
        #: the engine directory's revision this engine runs, as its heartbeats report it
        #: (the daemon sets it; '' when unknown)
        self.revision = ""
        self.retention = retention or Retention()
        # error events while open (logged otherwise), naming the host on a shared log
        self._errors = ErrorReports(self.clock, self.placement)
        self.supervisor = Supervisor(self._errors.report, clock=self.clock)
        #: every listener `instrument` attached, told of each tick and attempt
        self.instruments = InstrumentFanOut(self._errors.report)
        self._stack: contextlib.AsyncExitStack | None = None
        self._closing = Once("engine close")
        self._stores: HomeStores | None = None
        self._projector: Projector | None = None
        self._executor_loop: ExecutorLoop | None = None
        self._wake = asyncio.Event()
        self._interrupted = 0
        self.ticker = Ticker(self.chain, self.watchers, self.clock, self.layout.checkpoints,
                             default_tick_ms)
        self.ticker.host = self.placement
        self.ticker.unrecorded = self._errors.keep
        self.ticker.instruments = self.instruments

    # -- parts, available once open ----------------------------------------------------------

    def _open_part(self, part: T | None) -> T:
        if part is None:
            raise PulseError("engine is not open: use `async with engine:` or `await open()`")
        return part

    @property
    def stores(self) -> HomeStores:
        """The home's stores (events, vitals, side, objects)."""
        return self._open_part(self._stores)

    @property
    def events(self) -> EventStore:
        """The event log."""
        return self.stores.events

    @property
    def vitals(self) -> VitalsStore:
        """Watcher samples."""
        return self.stores.vitals

    @property
    def side(self) -> SideStore:
        """Small non-history state (quiet holds)."""
        return self.stores.side

    @property
    def objects(self) -> ObjectStore:
        """Content-addressed payloads."""
        return self.stores.objects

    @property
    def executor_loop(self) -> ExecutorLoop:
        """The loop that runs effects."""
        return self._open_part(self._executor_loop)

    @property
    def rule_names(self) -> tuple[str, ...]:
        """Every rule of the chain, outermost first."""
        return self.chain.names

    @property
    def ticks(self) -> int:
        """The number of the last tick (carried on across restarts of the same home)."""
        return self.ticker.number

    @property
    def last_tick_at(self) -> int | None:
        """When (engine clock, ms) the last tick took its snapshot; None before the first."""
        return self.ticker.last_tick_at

    @property
    def last_tick_ms(self) -> int:
        """The interval the last tick chose (the default before the first)."""
        return self.ticker.last_tick_ms

    @property
    def next_tick_at(self) -> int | None:
        """When (engine clock, ms) the next tick is due: the last tick's time plus the
        interval it chose (a wake comes sooner); None before the first tick."""
        at = self.ticker.last_tick_at
        return None if at is None else at + self.ticker.last_tick_ms

    @property
    def started_at(self) -> int:
        """When (engine clock, ms) this engine opened its home; 0 before."""
        return self.ticker.started_at

    @property
    def trace(self) -> list[RuleTrace]:
        """What each rule did in the last tick, outermost first."""
        return self.ticker.trace

    def loops(self) -> list[LoopStatus]:
        """Every supervised loop and its state."""
        return self.supervisor.status()

    def instrument(self, listener: Instruments) -> Callable[[], None]:
        """Tell `listener` of every tick and attempt from now on (see Instruments); returns
        the function that detaches it. A listener that raises is detached and reported."""
        return self.instruments.attach(listener)

    # -- lifecycle ---------------------------------------------------------------------------

    async def open(self) -> None:
        """Lock the home, open the stores, load checkpoints, fold the log up to now, and
        enter each layer's lifespan in order (LayerOpenFailed, naming the layer, when one
        raises: what was opened is closed again)."""
        stack = contextlib.AsyncExitStack()
        try:
            lock = lock_home(self.home)
            stack.callback(lock.close)
            self._stores = stores = await open_home(self.home, store=self.store_url,
                                                    side_store=self.side_store_url,
                                                    clock=self.clock, principal=self.principal)
            self._errors.open(stores.events, self.supervisor.spawn)
            stack.push_async_callback(self._close_stores)
            checkpoints = self.layout.checkpoints
            self._projector = Projector(stores.events, self.projection_list,
                                        checkpoints=checkpoints)
            self._executor_loop = ExecutorLoop(
                stores.events, self.executors, clock=self.clock,
                concurrency=self.executor_concurrency, scan_interval=self.executor_scan_interval,
                checkpoints=checkpoints, vitals=stores.vitals, side=stores.side,
                on_error=self._errors.report, host=self.host,
            )
            self._executor_loop.instruments = self.instruments
            await self._projector.catch_up()
            await self._executor_loop.refresh()
            await self.ticker.resume(stores.events, stores.vitals)
            # Which effects this host runs: another host's loop leaves them to it.
            await stores.events.append([EventDraft(
                "engine-started", "engine", {
                    "pid": os.getpid(), "owner": self._executor_loop.owner,
                    "host": self._executor_loop.host,
                    "heartbeat_ms": int(self.heartbeat_s * 1000)},
                origin="engine"), self._executor_loop.announcement()])
            stack.push_async_callback(self._stopped)
            for layer in self.layers:  # closed after the drain, before _stopped
                await enter_lifespan(stack, layer, self, self._errors.report)
            stack.push_async_callback(self._drain)  # after the loops stop, before _stopped
        except BaseException:
            await stack.aclose()
            raise
        self._stack = stack

    async def start(self) -> None:
        """Start the watcher, tick, executor and housekeeping loops and every service."""
        stack = self._open_part(self._stack)
        vitals = self.vitals
        # Undo first, start after: a start that fails halfway stops what it started.
        for watcher in self.watchers:
            stack.push_async_callback(self._close_watcher, watcher)
        stack.push_async_callback(self.supervisor.stop)
        self.supervisor.start("error-reports", self._errors.record_late)
        for layer in self.layers:  # services first: they may bind state the first tick reads
            for service in layer.services:
                self.supervisor.start(f"{SERVICE_PREFIX}{rule_name(service)}",
                                      lambda s=service: s(self))  # type: ignore[misc]
        for watcher in self.watchers:
            self.supervisor.start(
                f"watcher:{watcher.name}",
                lambda w=watcher: watch_forever(w, vitals, self.wake))  # type: ignore[misc]
        self.supervisor.start("tick", self._tick_loop)
        self.supervisor.start("executors", self.executor_loop.run)
        self.supervisor.start("housekeeping", lambda: housekeeping(
            self.ticker, vitals, self.retention, self._errors.report))
        self.supervisor.start("heartbeat", lambda: heartbeats(self.events, self.heartbeat,
                                                              self.heartbeat_s))

    async def __aenter__(self) -> Engine:
        await self.open()
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def run_forever(self) -> signal.Signals:
        """Open and start the engine, run it until SIGTERM or SIGINT (Ctrl-C), then close it
        as `close()` does (effects in flight drain up to `drain_timeout`, an engine-stopped
        event is recorded); return the signal that stopped it.

        The way to run an engine as a program of its own: `asyncio.run(engine.run_forever())`
        exits 0 on either signal, without a traceback. Runs in the main thread; raises what
        `open()` raises (HomeLocked when another engine holds the home).
        """
        async with stop_signals() as received, self:
            return await received

    async def close(self) -> None:
        """Stop every loop and service, drain effects in flight up to `drain_timeout`, exit
        the layers' lifespans (last opened first), persist the last snapshot and checkpoints,
        close the stores and release the home.

        From the first moment of close nothing new is claimed; close returns as soon as the
        attempts already running end. Attempts still running at the deadline are interrupted
        and recorded as retryable failures, so the next engine on this home runs them again.
        """
        await self._closing(self._begin_close)  # a second caller waits for the same close

    def _begin_close(self) -> Awaitable[None] | None:
        """Claim nothing new from now on, and undo what open and start did (None: not open)."""
        stack, self._stack = self._stack, None
        if stack is None:
            return None
        if self._executor_loop is not None:
            self._executor_loop.stop_claiming()
        return stack.aclose()

    async def _close_watcher(self, watcher: Watcher) -> None:
        try:
            await watcher.aclose()
        except Exception as exc:
            self._errors.report(f"watcher:{watcher.name}", exc)

    async def _drain(self) -> None:
        self._interrupted = await self.executor_loop.drain(self.drain_timeout)

    async def _stopped(self) -> None:
        await self.supervisor.settle()
        assert self._projector is not None
        await self._errors.settle()  # the reports an outage kept, before engine-stopped
        with contextlib.suppress(PulseError, OSError):
            await self._projector.checkpoint()
        await save_memo(self.ticker, self._errors.report)
        with contextlib.suppress(PulseError):
            await self.events.append([EventDraft(
                "engine-stopped", "engine",
                {"pid": os.getpid(), "interrupted": self._interrupted,
                 "owner": self.executor_loop.owner},
                origin="engine")])

    def heartbeat(self) -> EngineHeartbeat:
        """What this engine's next `engine-heartbeat` says."""
        loop = self.executor_loop
        return EngineHeartbeat(
            loop.owner, loop.host, os.getpid(), int(self.heartbeat_s * 1000), self.ticks,
            self.last_tick_at, [LoopBeat(s.name, s.state.value, s.restarts, s.last_error)
                                for s in self.loops()],
            installed_version(), self.revision)

    async def _close_stores(self) -> None:
        stores, self._stores = self._stores, None
        self._errors.close()
        if stores is not None:
            await stores.close()

    # -- the agent's side --------------------------------------------------------------------

    async def append(
        self, drafts: Sequence[EventDraft], expect: Mapping[str, int] | None = None
    ) -> AppendResult:
        """Append events to the log (human messages, tasks...) in one transaction."""
        return await self.events.append(drafts, expect)

    def wake(self) -> None:
        """Ask for a tick now; many wakes during one tick give one more tick, not many."""
        self._wake.set()

    async def replace_rules(self, rules: Sequence[Rule]) -> None:
        """Swap the business rules, atomically between two ticks.

        The survival, built-in and layer rules are never replaced. A chain that fails to
        compose raises here and the old one keeps running.
        """
        check_not_survival(self.survival, rules)
        async with self.ticker.lock:
            self.chain.replace_business(rules)

    # -- ticking -----------------------------------------------------------------------------

    async def snapshot(self) -> Snapshot:
        """The world as the next tick will see it."""
        snapshot, _ = await self.ticker.snapshot(self._open_part(self._projector),
                                                 self.executor_loop, self.vitals)
        return snapshot

    async def tick(self) -> Decision:
        """Run the rule chain once; record its effects, marks, errors and a tick record
        together in one append."""
        return await self.ticker.tick(self._open_part(self._projector), self.executor_loop,
                                      self.vitals, self.events)

    async def sample(self) -> None:
        """One reading of every watcher, taken now, each under its own timeout. A tick counts
        only samples taken since this engine opened: a dry run samples before it ticks."""
        await asyncio.gather(*(sample_once(w, self.vitals) for w in self.watchers))

    async def step(self) -> Decision:
        """One collect of every watcher, one tick, then executors until idle. For tests."""
        await self.sample()
        decision = await self.tick()
        await self.executor_loop.run_until_idle()
        return decision

    async def _tick_loop(self) -> None:
        while True:
            decision = await self.tick()
            await wait_signal(self._wake, decision.tick_ms / 1000)
            self._wake.clear()
