"""An engine's metrics in Prometheus' text format (docs/metrics.md): what its instruments
measured (ticks, dispatches, attempts), what its log holds (effects by state and type, and
what its layers count: `Layer.metrics`, such as a process's restarts), its vitals and the
size of its store.

Every exporter renders through a CollectorRegistry of its own, never the client's global
one. The log is folded once (LogTally): each scrape reads only the events appended since the
last, in pages. The instruments' readings are plain data (InstrumentReadings), so the
engine's process can tally them (InstrumentTally) and hand them to another process with its
report, where EngineMetrics renders them beside what it reads from the home.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import math
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import msgspec
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pulse_adapters.web._folding import LogFold
from pulse_core import (
    EFFECT_KINDS,
    QUARANTINED,
    EffectEntry,
    EffectOutcome,
    Engine,
    Event,
    EventStore,
    HomeStores,
    Instruments,
    LayerMetric,
    Projector,
    PulseError,
    Sample,
    SqliteRecorder,
    VitalsStore,
    fold_effect,
)

TICK_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
"""Upper bounds (seconds) of the tick duration histogram's buckets."""

WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                300.0)
"""Upper bounds (seconds) of the dispatch latency and executor duration buckets."""

VITAL_FIELDS_MAX = 64
"""The most numeric fields one vitals key exports (a watcher's data can be large)."""

VITAL_DEPTH = 3
"""How deep nested objects of a sample's data are followed (`disk_pct./home`)."""

LOG_KINDS = sorted(EFFECT_KINDS | {QUARANTINED})


class HistogramReading(msgspec.Struct):
    """One histogram series: how many observations fell in each bucket of its family's
    bounds (the last count is past every bound), and their sum."""

    counts: list[int]
    total: float = 0.0

    @classmethod
    def empty(cls, bounds: Sequence[float]) -> HistogramReading:
        """No observations yet, over `bounds`."""
        return cls([0] * (len(bounds) + 1))

    def observe(self, bounds: Sequence[float], value: float) -> None:
        """Count `value` in the first bucket whose bound is at least it."""
        self.counts[bisect_left(bounds, value)] += 1
        self.total += value

    def buckets(self, bounds: Sequence[float]) -> Sequence[tuple[str, float]]:
        """Cumulative counts by upper bound, as Prometheus' `le` buckets."""
        cumulative = list(itertools.accumulate(self.counts))
        return [(str(float(b)), c) for b, c in zip(bounds, cumulative, strict=False)] + [
            ("+Inf", cumulative[-1])]


class InstrumentReadings(msgspec.Struct, kw_only=True):
    """What an engine's instruments measured since it started: ticks, and the histograms of
    tick durations, dispatch latencies by effect type, and attempt durations by effect type
    and outcome. Plain data: an engine's report to another process can carry it."""

    ticks: int = 0
    tick: HistogramReading = msgspec.field(
        default_factory=lambda: HistogramReading.empty(TICK_BUCKETS))
    dispatch: dict[str, HistogramReading] = {}
    executed: dict[str, dict[str, HistogramReading]] = {}


class InstrumentTally(Instruments):
    """The listener that tallies an engine's instruments into InstrumentReadings."""

    def __init__(self) -> None:
        self._readings = InstrumentReadings()

    def readings(self) -> InstrumentReadings:
        """A copy of what was tallied so far."""
        return msgspec.convert(msgspec.to_builtins(self._readings), InstrumentReadings)

    def tick(self, number: int, duration_s: float) -> None:
        self._readings.ticks += 1
        self._readings.tick.observe(TICK_BUCKETS, duration_s)

    def dispatched(self, tag: str, latency_s: float) -> None:
        found = self._readings.dispatch.setdefault(tag, HistogramReading.empty(WAIT_BUCKETS))
        found.observe(WAIT_BUCKETS, latency_s)

    def executed(self, tag: str, outcome: EffectOutcome, duration_s: float) -> None:
        by_outcome = self._readings.executed.setdefault(tag, {})
        found = by_outcome.setdefault(outcome.value, HistogramReading.empty(WAIT_BUCKETS))
        found.observe(WAIT_BUCKETS, duration_s)


class LogTally(LogFold):
    """What the log says, folded as it grows: every effect's state and type (finished ones
    included). `catch_up` reads only what was appended since its last read; an effect is
    kept as its state and type alone, so a long log stays small here."""

    kinds = LOG_KINDS

    def __init__(self, events: EventStore) -> None:
        super().__init__(events)
        self.effects: collections.Counter[tuple[str, str]] = collections.Counter()
        self._entries: dict[str, EffectEntry] = {}
        self._bodies: dict[str, dict[str, Any]] = {}  # one stored body per effect type

    def fold(self, event: Event) -> None:
        entry = self._entries.get(event.key)
        if entry is not None:  # fold_effect changes it in place: count it out first
            self.effects[(str(entry.status), entry.tag)] -= 1
        entry = fold_effect(entry, event)
        if entry is None:
            return  # an event of an effect whose `effect` event was not seen
        if event.kind == "effect":
            entry.data = self._bodies.setdefault(entry.tag, {"effect": {"type": entry.tag}})
        entry.result = entry.error = None
        self._entries[event.key] = entry
        self.effects[(str(entry.status), entry.tag)] += 1


class LayerTally:
    """The layers' metrics (Layer.metrics), their projections folded as the log grows."""

    def __init__(self, events: EventStore, metrics: Sequence[LayerMetric]) -> None:
        self.metrics = tuple(metrics)
        projections = {m.projection.name: m.projection for m in self.metrics}
        self._projector = Projector(events, list(projections.values()))

    async def families(self) -> list[Metric]:
        """Each metric, read from its projection's state now."""
        if not self.metrics:
            return []
        states = await self._projector.catch_up()
        return [_layer_family(m, m.read(states[m.projection.name])) for m in self.metrics]


def _layer_family(metric: LayerMetric, found: float | Mapping[str, float]) -> Metric:
    kind = CounterMetricFamily if metric.kind == "counter" else GaugeMetricFamily
    if not isinstance(found, Mapping):
        return kind(metric.name, metric.help, value=found)
    family = kind(metric.name, metric.help, labels=[metric.label or "name"])
    for value, count in sorted(found.items()):
        family.add_metric([value], count)
    return family


def instrument_families(readings: InstrumentReadings) -> Iterator[Metric]:
    """The families of an engine's instruments."""
    ticks = CounterMetricFamily("pulse_ticks", "Ticks this engine ran since it started, quiet "
                                               "ones included", value=readings.ticks)
    yield ticks
    tick = HistogramMetricFamily("pulse_tick_duration_seconds",
                                 "How long each tick took: snapshot, rule chain, append")
    tick.add_metric([], readings.tick.buckets(TICK_BUCKETS), readings.tick.total)
    yield tick
    dispatch = HistogramMetricFamily(
        "pulse_effect_dispatch_latency_seconds", "How long an attempt at an effect waited "
        "from when it became due (its commit, its retry time or its lease's end) to its claim",
        labels=["tag"])
    for tag, found in sorted(readings.dispatch.items()):
        dispatch.add_metric([tag], found.buckets(WAIT_BUCKETS), found.total)
    yield dispatch
    executed = HistogramMetricFamily(
        "pulse_executor_duration_seconds", "How long each attempt took, from its claim to its "
        "recorded outcome, by effect type and outcome", labels=["tag", "outcome"])
    for tag, by_outcome in sorted(readings.executed.items()):
        for outcome, found in sorted(by_outcome.items()):
            executed.add_metric([tag, outcome], found.buckets(WAIT_BUCKETS), found.total)
    yield executed


def log_families(log: LogTally) -> Iterator[Metric]:
    """The families folded from the log."""
    effects = GaugeMetricFamily("pulse_effects", "Effects in the log by state and type, "
                                                 "finished ones included", labels=["state", "tag"])
    for (state, tag), count in sorted(log.effects.items()):
        effects.add_metric([state, tag], count)
    yield effects


def store_families(log: LogTally) -> Iterator[Metric]:
    """The size of the log: its newest seq, and its files where it is a SQLite file."""
    yield GaugeMetricFamily("pulse_store_last_seq", "The seq of the log's newest event "
                            "(seqs count the events appended)", value=log.head)
    files = GaugeMetricFamily("pulse_store_file_bytes", "Size of the event log's files, where "
                              "the log is a SQLite file", labels=["file"])
    recorder = log.events.recorder
    if isinstance(recorder, SqliteRecorder):
        for path in (recorder.path, recorder.path.with_name(recorder.path.name + "-wal")):
            try:
                files.add_metric([path.name], path.stat().st_size)
            except OSError:
                continue  # no -wal (a closed log), or not readable: nothing to say
    yield files


def vital_fields(data: Any) -> list[tuple[str, float]]:
    """The numeric fields of a sample's data (booleans as 0 and 1), nested objects followed
    VITAL_DEPTH deep as dotted names, at most VITAL_FIELDS_MAX; `value` for a bare number."""
    found: list[tuple[str, float]] = []

    def walk(value: Any, name: str, depth: int) -> None:
        if len(found) >= VITAL_FIELDS_MAX:
            return
        if isinstance(value, bool | int | float):
            number = float(value) if abs(value) < 2**1023 else math.inf
            if math.isfinite(number):
                found.append((name or "value", number))
        elif isinstance(value, dict) and depth < VITAL_DEPTH:
            for key, inner in value.items():
                walk(inner, f"{name}.{key}" if name else str(key), depth + 1)

    walk(data, "", 0)
    return found


def vital_families(latest: Mapping[str, Sample]) -> Iterator[Metric]:
    """Each vitals key's latest sample: its numeric fields, whether it was ok, and when."""
    fields = GaugeMetricFamily("pulse_vital", "A numeric field of a vitals key's latest "
                               "sample", labels=["key", "field"])
    ok = GaugeMetricFamily("pulse_vital_ok", "Whether a vitals key's latest sample was "
                           "taken without error (1) or not (0)", labels=["key"])
    at = GaugeMetricFamily("pulse_vital_timestamp_seconds", "When a vitals key's latest "
                           "sample was taken (engine clock)", labels=["key"])
    for key, sample in sorted(latest.items()):
        ok.add_metric([key], 1.0 if sample.ok else 0.0)
        at.add_metric([key], sample.ts / 1000)
        for name, value in vital_fields(sample.data if sample.ok else None):
            fields.add_metric([key, name], value)
    yield from (fields, ok, at)


class _Exposition(Collector):
    """A registry of its own (never the client's global one) and the families it renders."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(self)
        self._families: list[Metric] = []

    def collect(self) -> Iterable[Metric]:
        return list(self._families)

    def render(self, families: Iterable[Metric]) -> bytes:
        """`families` in Prometheus' text format."""
        self._families = list(families)
        return generate_latest(self.registry)


class _Keyed(Protocol):
    @property
    def key(self) -> str: ...


class Observed(Protocol):
    """What EngineMetrics reads: a pulse_core.Engine, or a view of one offering the same."""

    @property
    def events(self) -> EventStore: ...

    @property
    def vitals(self) -> VitalsStore: ...

    @property
    def watchers(self) -> Sequence[_Keyed]: ...


class EngineMetrics:
    """The metrics of `engine`: `attach()` tallies its instruments from then on,
    `exposition()` renders every family (see the module), `close()` detaches.

    In a process other than the engine's, give the engine's view and `readings`: the latest
    InstrumentReadings its InstrumentTally sent (attach() needs the Engine itself). `extra`
    gives families of the exporting process's own (the web UI's streams); `metrics` the
    layers' (None: those of the Engine's own layers).
    """

    def __init__(self, engine: Observed, *,
                 readings: Callable[[], InstrumentReadings] | None = None,
                 extra: Callable[[], Iterable[Metric]] = tuple,
                 metrics: Sequence[LayerMetric] | None = None) -> None:
        self.engine = engine
        self.extra = extra
        self.tally = InstrumentTally()
        self.readings = readings or self.tally.readings
        self.log = LogTally(engine.events)
        if metrics is None:  # the Engine's own layers'
            metrics = [m for la in getattr(engine, "layers", ()) for m in la.metrics]
        self.layers = LayerTally(engine.events, metrics)
        self._exposition = _Exposition()
        self.registry = self._exposition.registry
        self._detach: Callable[[], None] | None = None
        self._scraping = asyncio.Lock()

    def attach(self) -> None:
        """Tally the engine's instruments from now on (once; again after `close`)."""
        if not isinstance(self.engine, Engine):
            raise PulseError(f"EngineMetrics.attach needs the Engine itself, not a "
                             f"{type(self.engine).__name__}: in another process, pass the "
                             "engine's InstrumentReadings as `readings`")
        if self._detach is None:
            self._detach = self.engine.instrument(self.tally)

    def close(self) -> None:
        """Stop tallying (what was tallied is still rendered)."""
        detach, self._detach = self._detach, None
        if detach is not None:
            detach()

    async def exposition(self) -> bytes:
        """Every family, in Prometheus' text format, folding only the log's new events."""
        async with self._scraping:
            await self.log.catch_up()
            keys = [watcher.key for watcher in self.engine.watchers]
            latest = await self.engine.vitals.latest(keys) if keys else {}
            layers = await self.layers.families()
            return self._exposition.render([
                *instrument_families(self.readings()), *log_families(self.log), *layers,
                *vital_families(latest), *store_families(self.log), *self.extra()])


async def log_exposition(stores: HomeStores, metrics: Sequence[LayerMetric] = ()) -> bytes:
    """The families a home's log holds (effects, the layers' `metrics`, the store's size),
    read without a running engine: `stores` may be opened read-only."""
    log = LogTally(stores.events)
    await log.catch_up()
    layers = await LayerTally(stores.events, metrics).families()
    return _Exposition().render([*log_families(log), *layers, *store_families(log)])
