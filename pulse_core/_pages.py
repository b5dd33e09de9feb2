"""A layer's pages in the web UI and its metrics: plain data and callables, no web library.

A page is a slug, a title for the nav, the projections it reads and a JSON view; the web UI
(pulse_adapters.web) serves it at `/<slug>`, its view at `/api/pages/<slug>`, behind the same
guard as every page, and folds its projections in the UI's own process over the home's stores
opened read-only. A page without `assets` is drawn by the UI's generic page from the view's
JSON; with `assets` it brings its own `index.html` and scripts.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pulse_core._effects import EffectEntry
from pulse_core._errors import LayerError
from pulse_core._events import Event, EventDraft
from pulse_core._snapshot import Projection, Snapshot
from pulse_core.store import EventStore, VitalsStore

SLUG = re.compile(r"^[a-z0-9][a-z0-9-]{0,39}$")
"""What a page's slug may be: lowercase letters, digits and '-', at most 40."""
METRIC_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


@dataclass(frozen=True)
class PageRequest:
    """What a page's view is given at each request: the home, its event log and vitals (both
    read-only), the snapshot of the projections the UI folds (`snapshot.state(T)` for each of
    the page's projections), the time (engine clock, ms), the request's query parameters, the
    layers the engine runs, and `effects(tag)`, every effect of one type in the log, newest
    first. A page's action is also given `append`, which appends drafts to the log, and
    `origin`, who acts (the UI's operator, `web`: its events' origin is `human:web`); a view
    gets neither."""

    home: Path
    events: EventStore
    vitals: VitalsStore
    snapshot: Snapshot
    now: int
    query: Mapping[str, str] = field(default_factory=dict)
    layers: tuple[str, ...] = ()
    effects: Callable[[str], Sequence[EffectEntry]] = lambda tag: ()
    append: Callable[[Sequence[EventDraft]], Awaitable[list[Event]]] | None = None
    origin: str = ""


PageView = Callable[[PageRequest], Awaitable[Any]]
"""A page's JSON view: `await view(request)` gives what msgspec can encode (dicts, lists,
Structs). A view may raise LookupError for a 404 and ValueError for a 400 (a bad query); the
message is shown."""
PageAction = Callable[[PageRequest, Any], Awaitable[Any]]
"""A change a page offers its operator: `await action(request, body)`, `body` the JSON the UI
posted (None for none), gives what msgspec can encode. It writes through `request.append`.
LookupError answers 404, ValueError 400, another PulseError 409; the message is shown."""


@dataclass(frozen=True)
class UiPage:
    """One page a layer shows in the web UI (see the module's docstring).

    `assets` names a folder of package files as `package:folder`
    (`"pulse_adapters.awareness:ui"`): its `index.html` is the page, and every file in it is
    served under `/pages/<slug>/`. Without it the UI draws the view's JSON: a list of objects
    as a table, an object's scalars as cards, a nested object by its keys. `actions` are the
    changes the page offers, by name: each is served at `POST /api/pages/<slug>/<name>`
    behind the UI's guard, as the UI's own controls are.
    """

    slug: str
    title: str
    view: PageView
    projections: Sequence[Projection[Any]] = ()
    assets: str | None = None
    actions: Mapping[str, PageAction] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in self.actions:
            if not SLUG.match(name):
                raise LayerError(f"page {self.slug!r}: action {name!r} must be 1-40 lowercase "
                                 "letters, digits or '-' — it is the action's path")
        if not SLUG.match(self.slug):
            raise LayerError(f"page slug {self.slug!r} must be 1-40 lowercase letters, digits "
                             "or '-', starting with a letter or digit — it is the page's path")
        if not self.title.strip():
            raise LayerError(f"page {self.slug!r} has no title: give the nav's name for it")
        if self.assets is not None and ":" not in self.assets:
            raise LayerError(f"page {self.slug!r}: assets {self.assets!r} must be "
                             "'package:folder', a folder of the package's files")


@dataclass(frozen=True)
class LayerMetric:
    """A counter or gauge a layer adds to the web UI's /metrics (and to `upulse metrics`),
    read from the state of `projection`, which the UI folds: `read(state)` gives one value,
    or a value per `label` value (`{"gateway": 2}` with label `process`). A counter's name
    gets `_total` in the exposition."""

    name: str
    help: str
    projection: Projection[Any]
    read: Callable[[Any], float | Mapping[str, float]]
    label: str | None = None
    kind: Literal["counter", "gauge"] = "counter"

    def __post_init__(self) -> None:
        for what, name in (("name", self.name), ("label", self.label or "x")):
            if not METRIC_NAME.match(name) or name.endswith("_total"):
                raise LayerError(f"metric {self.name!r}: {what} {name!r} must be snake_case "
                                 "(letters, digits, '_'), without `_total` (a counter gets it)")
