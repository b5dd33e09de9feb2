"""The awareness layer: every part of the reviewer built from one AwarenessSettings.

The route probe writes the `llm-route` vitals the rule reads; the rule emits
`awareness-review` effects and keeps the quiet hold; the executor asks the model through the
same ChatClient, gates and settles; the ledger folds the cycle records back for the rule.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from pulse_adapters.awareness.effects import AwarenessReview
from pulse_adapters.awareness.executor import AwarenessExecutor
from pulse_adapters.awareness.foreground import Foreground, ForegroundFollower
from pulse_adapters.awareness.ledger import AwarenessLedger
from pulse_adapters.awareness.page import reviewer_metrics, reviewer_page
from pulse_adapters.awareness.quiet import QuietHold
from pulse_adapters.awareness.rule import AwarenessRule
from pulse_adapters.awareness.settings import LAYER, AwarenessSettings, load_settings
from pulse_adapters.llm import ChatClient, RouteHealth, RouteProbeWatcher
from pulse_core import Engine, Layer, LayerContext


class QuietHoldKeeper:
    """The layer's service: from engine start it keeps the quiet hold in the engine's side
    store (errors reported to its log), and at engine stop writes what is left."""

    name = "awareness-quiet-hold"

    def __init__(self, quiet: QuietHold) -> None:
        self.quiet = quiet

    async def __call__(self, engine: Engine) -> None:
        self.quiet.bind(engine.side, engine.events)
        try:
            await asyncio.Event().wait()
        finally:
            await self.quiet.drain()


class ReviewRouteWatcher(RouteProbeWatcher):
    """The route probe of the layer's own ChatClient, which it closes when the engine closes
    its watchers (after the reviews in flight have drained)."""

    async def aclose(self) -> None:
        await self.health.client.aclose()


@dataclass(frozen=True)
class Reviewer:
    """The reviewer's parts, and `layer`, the Layer that runs them together.

    `foreground.begin(holder)` / `.end(holder)` bracket foreground work on a shared model
    route, so that reviews sharing it wait while it runs and one in flight is preempted
    (`foreground_of(engine)` reaches it from a running engine).
    """

    settings: AwarenessSettings
    client: ChatClient
    health: RouteHealth
    watcher: RouteProbeWatcher
    ledger: AwarenessLedger
    quiet: QuietHold
    rule: AwarenessRule
    executor: AwarenessExecutor
    foreground: Foreground
    layer: Layer


def build_reviewer(settings: Any, context: LayerContext) -> Reviewer:
    """Build the reviewer from `settings` (AwarenessSettings, or config.json's object);
    AwarenessSettingsError names a missing or wrong setting, or an unset API-key variable."""
    valid = load_settings(settings)
    config = valid.review
    client = valid.client()
    health = valid.route_health(client, context.clock)
    watcher = ReviewRouteWatcher(health)
    ledger = AwarenessLedger(config)
    # a stored hold outlives every check and ceiling it can defer, then the store drops it
    quiet = QuietHold(ttl_ms=int(2 * (config.quiet_ceiling_s + config.quiet_hold_s) * 1000))
    rule = AwarenessRule(config, quiet, route_key=valid.route_key)
    foreground = Foreground(lapse_s=config.foreground_lapse_s, clock=context.clock)
    executor = AwarenessExecutor(client, config, route=health, foreground=foreground)
    bundle = Layer(LAYER, watchers=(watcher,), rules=(rule,), executors=(executor,),
                   projections=(ledger,),
                   services=(QuietHoldKeeper(quiet), ForegroundFollower(foreground)),
                   emits=(AwarenessReview,), ui=(reviewer_page(ledger),),
                   metrics=reviewer_metrics())
    return Reviewer(valid, client, health, watcher, ledger, quiet, rule, executor, foreground,
                    bundle)


def layer(settings: Any, context: LayerContext) -> Layer:
    """The awareness layer (entry point `awareness` in group `pulse.layers`): the route probe,
    the rule, the executor, the ledger and the quiet-hold service, built from `settings`."""
    return build_reviewer(settings, context).layer
