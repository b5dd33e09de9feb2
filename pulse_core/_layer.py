"""Layers: named bundles of watchers, rules, executors, projections and services.

A layer is how every capability beyond the core plugs into an engine: the survival layer,
the awareness reviewer, an agent adapter, the web UI. Layers are found by name through the
standard plugin mechanism, entry points: a distribution declares

    [project.entry-points."pulse.layers"]
    awareness = "pulse_adapters.awareness:layer"

and config.json (or `Engine(layers=[...])`) names the layer and its settings. The survival
layer is found the same way, in its own group `pulse.survival`, and must be there exactly once:
the engine refuses to run without it.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgspec

from pulse_core._clock import Clock
from pulse_core._effects import Effect, Executor, Mark, executors_by_tag
from pulse_core._errors import (
    LayerError,
    LayerOpenFailed,
    PulseError,
    SurvivalLocked,
    UnhandledEffect,
)
from pulse_core._pages import LayerMetric, UiPage
from pulse_core._rules import Rule, declared_effects, rule_name
from pulse_core._snapshot import Projection
from pulse_core._watchers import Watcher

if TYPE_CHECKING:
    from pulse_core._engine import Engine

LAYERS_GROUP = "pulse.layers"
SURVIVAL_GROUP = "pulse.survival"

Service = Callable[["Engine"], Awaitable[None]]
"""A long-running async callable (a web server, an exporter, a transcript follower) that the
engine starts after open and cancels before close, under its supervisor."""

Lifespan = Callable[["Engine"], AbstractAsyncContextManager[None]]
"""What a layer holds open while its engine runs (a model client, a connection pool): entered
when the engine opens, before any service or executor runs, and exited when it closes, after
every service stopped and every effect in flight drained, layers in reverse order."""


class EngineDirectory(Protocol):
    """The shallow autonomic tier as a layer sees it: code that can be rolled back."""

    async def rollback(self, revision: str | None, reason: str) -> str:
        """Revert to `revision` (None: the last known good one); return the new revision."""
        ...


class Rollback(Effect, tag="rollback"):
    """Roll the engine directory back: to `revision`, or to the last known good one.

    Asked for by the survival layer's rollback rules, by an operator (the CLI, the web UI's
    rule chain); run by the survival layer's executor, which calls the EngineDirectory."""

    reason: str
    revision: str | None = None
    emergency: bool = False

    def dedup_key(self) -> str:
        return "rollback"


class Essential(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """A process the agent cannot live without: how to find it and how to start it again.

    Found by `pidfile` first, else by `match_name` (process name), else by `match_cmdline`
    (a substring of the joined command line), else as a process of the same user whose
    command line is `argv` (one started by hand is adopted); a process found by name,
    command line or argv must also have each of `match_env`'s variables set to its value
    (how to tell apart one program's processes run for different homes). `argv` restarts it
    (never a shell string), in `cwd` with `env` added, its output appended to `log`. The
    survival layer keeps alive the processes its own settings list and every layer's
    `essentials`.
    """

    name: str
    argv: tuple[str, ...] = ()
    pidfile: str | None = None
    match_name: str | None = None
    match_cmdline: str | None = None
    match_env: dict[str, str] = {}
    cwd: str | None = None
    env: dict[str, str] = {}
    log: str | None = None

    def __post_init__(self) -> None:
        if not (self.pidfile or self.match_name or self.match_cmdline):
            raise LayerError(f"essential process {self.name!r} has no way to find the "
                             "process — give pidfile, match_name or match_cmdline")


@dataclass(frozen=True)
class LayerContext:
    """What a layer factory is given besides its settings: the home it serves, the engine's
    clock, the engine directory (None when the engine runs without one), the host the
    engine runs on where engines of several hosts share one log ('' otherwise), and (for the
    survival layer) the essential processes the engine's other layers declare."""

    home: Path
    clock: Clock
    engine_directory: EngineDirectory | None = None
    host: str = ""
    essentials: tuple[Essential, ...] = ()


@dataclass(frozen=True)
class Layer:
    """A named, configured bundle of parts that an engine runs together.

    Rules of all layers sit between the built-in rules and the engine directory's business
    rules, in the order the layers are given. `emits` lists effect types the layer's rules
    may produce beyond what each rule declares (see `emits()`); the engine checks that some
    executor handles each one. `essentials` are processes (an agent's gateway) the layer asks
    the survival layer to keep alive under its restart policy. `lifespan` is what the layer
    holds open while the engine runs (see Lifespan). `ui` are the layer's pages in the web UI
    (see UiPage) and `metrics` what it adds to /metrics (see LayerMetric): the UI's process
    builds the layer to read them, so a factory opens and starts nothing; what must be opened
    goes in `lifespan`.
    """

    name: str
    watchers: Sequence[Watcher] = ()
    rules: Sequence[Rule] = ()
    executors: Sequence[Executor] = ()
    projections: Sequence[Projection[Any]] = ()
    services: Sequence[Service] = ()
    emits: Sequence[type[Effect]] = field(default=())
    essentials: Sequence[Essential] = ()
    lifespan: Lifespan | None = None
    ui: Sequence[UiPage] = ()
    metrics: Sequence[LayerMetric] = ()


async def enter_lifespan(stack: AsyncExitStack, layer: Layer, engine: Engine,
                         report: Callable[[str, BaseException], None]) -> None:
    """Enter `layer`'s lifespan (if it has one) for `engine`, on `stack`: LayerOpenFailed,
    naming the layer, if it raises; at close, what its exit raises goes to `report` (the
    engine's `error` event, key `layer:<name>`) and the stack's other callbacks run all the
    same."""
    if layer.lifespan is None:
        return
    try:
        context = layer.lifespan(engine)
        await context.__aenter__()
    except Exception as exc:
        raise LayerOpenFailed(
            f"layer {layer.name!r} failed to open (its lifespan raised "
            f"{type(exc).__name__}: {exc}); the engine did not open — fix what the error "
            "names, or take the layer out of config.json") from exc

    async def close() -> None:
        try:
            await context.__aexit__(None, None, None)
        except Exception as exc:
            report(f"layer:{layer.name}", exc)

    stack.push_async_callback(close)


LayerFactory = Callable[[Any, LayerContext], Layer]
"""`factory(settings, context) -> Layer`: what an entry point in `pulse.layers` names.

`settings` is the layer's value in config.json (a JSON object, or None when absent); the
factory validates it (a msgspec Struct is the usual way) and raises an error naming the field.
"""


_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`")


_INDEX = re.compile(r"\[\d+\]")


def _struct_at(root: type[msgspec.Struct], where: str) -> Any:
    """The Struct type at the dotted path `where` (`agents[0].limits`) inside `root`: through
    a field's Struct, or the Struct an optional, tuple, list or mapping field holds."""
    struct: Any = root
    for part in filter(None, where.split(".")):
        annotation = {f.encode_name: f.type for f in msgspec.structs.fields(struct)}[
            _INDEX.sub("", part)]
        candidates = (annotation, *typing.get_args(annotation))
        struct = next(c for c in candidates
                      if isinstance(c, type) and issubclass(c, msgspec.Struct))
    return struct


def settings_problem(root: type[msgspec.Struct], exc: msgspec.ValidationError) -> str:
    """What `exc` (from `msgspec.convert(settings, root)`) says is wrong with a layer's
    settings, naming the dotted field: for an unknown field, the closest allowed name and
    every allowed one (or, for a name the struct lists in a `renamed_fields` class variable,
    what it became: "`model`"); a check of the layer's own that says "`field` problem" is
    placed inside the object it was raised in."""
    message, at, where = str(exc).rpartition(" - at `$.")
    where = where.rstrip("`") if at else ""
    message = message or str(exc)
    unknown = _UNKNOWN.match(message)
    if unknown:
        struct = _struct_at(root, where)
        allowed = [f.encode_name for f in msgspec.structs.fields(struct)]
        renamed = getattr(struct, "renamed_fields", {}).get(unknown["name"])
        close = difflib.get_close_matches(unknown["name"], allowed, n=1)
        hint = f" (did you mean `{close[0]}`?)" if close else ""
        if renamed:
            hint = f" (renamed: now {renamed})"
        inside = f"setting `{where}`: " if where else ""
        return f"{inside}unknown field `{unknown['name']}`{hint} — allowed: {', '.join(allowed)}"
    if message.startswith("`"):
        field, _, problem = message[1:].partition("` ")
        return f"setting `{'.'.join(filter(None, (where, field)))}` {problem}"
    return f"setting `{where}` is wrong: {message}" if where else message


S = TypeVar("S", bound=msgspec.Struct)


def layer_settings(settings: Any, root: type[S], error: type[PulseError], layer: str) -> S:
    """`settings` as the layer's `root` Struct: one already, None (every default), or
    config.json's object for `layer`. Anything else, or a field that is unknown or wrong, is
    refused with `error` naming it from config.json's root (`setting
    `layers.<layer>.<field>` ...`, as `settings_problem` words it)."""
    if isinstance(settings, root):
        return settings
    if settings is None:
        settings = {}
    if not isinstance(settings, Mapping):
        raise error(f"layers.{layer} must be a JSON object of the layer's settings, not "
                    f"{type(settings).__name__}")
    try:
        return msgspec.convert(dict(settings), root)
    except msgspec.ValidationError as exc:
        problem = settings_problem(root, exc)
    if problem.startswith("setting `"):
        raise error(f"setting `layers.{layer}.{problem.removeprefix('setting `')}")
    raise error(f"layers.{layer}: {problem}")


def _entry_points(group: str, name: str | None = None) -> list[EntryPoint]:
    found = entry_points(group=group)
    return [ep for ep in found if name is None or ep.name == name]


def available_layers() -> list[str]:
    """The names of every layer installed in this environment (group `pulse.layers`)."""
    return sorted({ep.name for ep in _entry_points(LAYERS_GROUP)})


def _load_factory(ep: EntryPoint, what: str) -> LayerFactory:
    try:
        factory = ep.load()
    except Exception as exc:
        raise LayerError(
            f"{what} {ep.name!r} ({ep.value}) failed to import: {type(exc).__name__}: {exc} — "
            "fix or reinstall the distribution that provides it"
        ) from exc
    if not callable(factory):
        raise LayerError(f"{what} {ep.name!r} ({ep.value}) is a {type(factory).__name__}, "
                         "not a factory(settings, context) -> Layer")
    return factory  # type: ignore[no-any-return]


def _built(factory: LayerFactory, name: str, settings: Any, context: LayerContext) -> Layer:
    try:
        layer = factory(settings, context)
    except (LayerError, SurvivalLocked):
        raise
    except Exception as exc:
        raise LayerError(f"layer {name!r} refused its settings: {type(exc).__name__}: "
                         f"{exc}") from exc
    if not isinstance(layer, Layer):
        raise LayerError(f"layer {name!r}'s factory returned {layer!r}, not a pulse_core.Layer")
    return layer


def load_layer(name: str, settings: Any, context: LayerContext) -> Layer:
    """Build the installed layer `name` with `settings`; LayerError names what went wrong."""
    found = _entry_points(LAYERS_GROUP, name)
    if not found:
        known = ", ".join(available_layers()) or "none"
        raise LayerError(f"no layer named {name!r} is installed (installed: {known}) — "
                         "install the distribution that provides it, or fix the name")
    if len({ep.value for ep in found}) > 1:
        raise LayerError(f"layer {name!r} is provided by several distributions "
                         f"({', '.join(ep.value for ep in found)}); uninstall all but one")
    return _built(_load_factory(found[0], "layer"), name, settings, context)


def load_layers(configured: Mapping[str, Any], context: LayerContext) -> list[Layer]:
    """Every layer named in `configured` (name -> settings), in that order."""
    return [load_layer(name, settings, context) for name, settings in configured.items()]


def load_survival_layer(settings: Any, context: LayerContext) -> Layer:
    """The survival layer (group `pulse.survival`), which every engine runs outermost.

    Raises LayerError when it is not installed, or installed twice: an engine never runs
    without its survival rules.
    """
    found = _entry_points(SURVIVAL_GROUP)
    if len({ep.value for ep in found}) != 1:
        have = ", ".join(f"{ep.name}={ep.value}" for ep in found) or "none"
        raise LayerError(
            f"exactly one survival layer must be installed in entry-point group "
            f"{SURVIVAL_GROUP!r}; found {have} — reinstall upulse"
        )
    layer = _built(_load_factory(found[0], "survival layer"), "survival", settings, context)
    if layer.services:
        raise LayerError("the survival layer may not run services")
    return layer


def check_layers(layers: Sequence[Layer]) -> None:
    """Refuse, when an engine is built, what could not run: repeated layer, watcher or
    service names, two executors for one effect type, a watcher without a positive interval
    and timeout, and an effect a layer declares that no executor handles."""
    for what, names in (
        ("layer", [la.name for la in layers]),
        ("watcher", [w.name for la in layers for w in la.watchers]),
        ("service", [rule_name(s) for la in layers for s in la.services]),
    ):
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise PulseError(f"{what} names must be unique in an engine; repeated: "
                             f"{', '.join(repeated)} — give each its own `name`")
    executors = [e for la in layers for e in la.executors]
    executors_by_tag(executors)  # the executor loop's own check, at build time
    for watcher in (w for la in layers for w in la.watchers):
        if not watcher.interval > 0 or not watcher.timeout > 0:
            raise PulseError(
                f"watcher {watcher.name!r} has interval={watcher.interval!r} and "
                f"timeout={watcher.timeout!r}; both must be seconds > 0")
    handled = {t.tag() for e in executors for t in e.handles}
    for layer in layers:
        declared = [(rule_name(r), t) for r in layer.rules for t in declared_effects(r)]
        declared += [(f"layer {layer.name}", t) for t in layer.emits]
        for who, effect in declared:
            if not issubclass(effect, Mark) and effect.tag() not in handled:
                raise UnhandledEffect(
                    f"{who} (layer {layer.name!r}) emits {effect.tag()!r} "
                    f"({effect.__name__}) but no executor handles it (handled: "
                    f"{', '.join(sorted(handled)) or 'none'}) — add an executor for it")
