"""What layers give the UI: their pages (`Layer.ui`: which are served, where their files are,
the projections they read), their metrics (`Layer.metrics`), and what kept a layer's out.

The UI's process learns them by building the layers HOME/config.json names, and the survival
layer, the way the engine builds them (a factory opens and starts nothing: what a layer opens
is in its lifespan, which the UI never enters). A layer that cannot be built here, or a page
whose slug is taken, is left out and named in `problems`; the other pages are served.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from pulse_core import (
    Layer,
    LayerContext,
    LayerMetric,
    Projection,
    SystemClock,
    UiPage,
    builtin_projections,
    load_layer,
    load_survival_layer,
)


@dataclass(frozen=True)
class LayerPage:
    """A page of `layer`, with the folder of its own files (None: the generic page)."""

    layer: str
    page: UiPage
    assets: Path | None = None


@dataclass(frozen=True)
class LayerPages:
    """The layers' pages the UI serves, their metrics, and what kept others out (one
    sentence each)."""

    pages: tuple[LayerPage, ...] = ()
    problems: tuple[str, ...] = ()
    metrics: tuple[LayerMetric, ...] = ()

    def find(self, slug: str) -> LayerPage | None:
        """The page served at `/<slug>`, if any."""
        return next((p for p in self.pages if p.page.slug == slug), None)

    def projections(self) -> list[Projection[Any]]:
        """What the UI folds: the engine's built-in projections, then each page's, each name
        once (the first one given)."""
        found: dict[str, Projection[Any]] = {}
        for projection in (*builtin_projections(),
                           *(p for lp in self.pages for p in lp.page.projections)):
            found.setdefault(projection.name, projection)
        return list(found.values())


def _assets(page: UiPage) -> Path:
    """The folder `page.assets` names; ValueError when it holds no index.html."""
    assert page.assets is not None
    package, _, folder = page.assets.partition(":")
    try:
        path = Path(str(files(package) / folder))
    except ModuleNotFoundError as exc:
        raise ValueError(f"its assets {page.assets!r} name no installed package") from exc
    if not (path / "index.html").is_file():
        raise ValueError(f"its assets folder {path} has no index.html")
    return path


def pages_of(layers: Sequence[Layer], reserved: Collection[str],
             problems: Sequence[str] = ()) -> LayerPages:
    """The pages and metrics of `layers`, in order; a page whose slug is `reserved` (the
    UI's own) or taken by an earlier one, or whose assets cannot be found, and a metric whose
    name an earlier one has, are left out and said why."""
    found: list[LayerPage] = []
    said = list(problems)
    metrics: dict[str, LayerMetric] = {}
    for layer in layers:
        for metric in layer.metrics:
            if metric.name in metrics:
                said.append(f"layer {layer.name!r}: metric {metric.name!r} is left out: an "
                            "earlier layer's has that name — rename one")
                continue
            metrics[metric.name] = metric
        for page in layer.ui:
            taken = next((p.layer for p in found if p.page.slug == page.slug), None)
            if page.slug in reserved or taken is not None:
                by = "the UI's own page" if taken is None else f"layer {taken!r}'s page"
                said.append(f"layer {layer.name!r}: page {page.slug!r} is left out: "
                            f"/{page.slug} is {by} — give the page another slug")
                continue
            try:
                assets = None if page.assets is None else _assets(page)
            except ValueError as exc:
                said.append(f"layer {layer.name!r}: page {page.slug!r} is left out: {exc}")
                continue
            found.append(LayerPage(layer.name, page, assets))
    return LayerPages(tuple(found), tuple(said), tuple(metrics.values()))


def _config(home: Path) -> dict[str, Any]:
    path = home / "config.json"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}  # an engine built in code: its layers' pages are not known here
    return data if isinstance(data, dict) else {}


def configured_pages(home: Path, placement: str, reserved: Collection[str]) -> LayerPages:
    """The pages of the layers HOME/config.json names and of the survival layer, built in
    this process for `home` (as the engine bound to `placement` builds them); each layer
    that cannot be built is named in `problems` with what it raised."""
    problems: list[str] = []
    try:
        config = _config(home)
    except (OSError, ValueError) as exc:
        config = {}
        problems.append(f"{home / 'config.json'} cannot be read ({exc}): only the UI's own "
                        "pages are shown")
    context = LayerContext(home, SystemClock(), None, placement)
    layers: list[Layer] = []
    configured = config.get("layers")
    for name, settings in (configured.items() if isinstance(configured, dict) else ()):
        try:
            layers.append(load_layer(name, settings, context))
        except Exception as exc:  # any layer's failure: its pages are out, the rest served
            problems.append(f"layer {name!r} could not be built in the UI's process, its "
                            f"pages are not shown: {type(exc).__name__}: {exc}")
    essentials = tuple(e for la in layers for e in la.essentials)
    try:
        survival = load_survival_layer(config.get("survival"), LayerContext(
            home, context.clock, None, placement, essentials))
    except Exception as exc:
        problems.append(f"the survival layer could not be built in the UI's process, its "
                        f"pages are not shown: {type(exc).__name__}: {exc}")
    else:
        layers.insert(0, survival)
    return pages_of(layers, reserved, problems)


def configured_metrics(home: Path) -> tuple[LayerMetric, ...]:
    """The metrics of the layers HOME/config.json names and of the survival layer (those
    that can be built), for reading a home's log without its engine."""
    return configured_pages(home, "", ()).metrics
