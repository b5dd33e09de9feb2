"""The Rule chain page's API: the engine's rule tiers with each rule's decision in the last
tick, the engine directory's promote and rollback history, and the rollback control.

The tiers come in chain order: survival (fixed, outermost), built-in, each layer's rules, then
the business rules at the engine directory's revision. What each rule did is the engine's
trace of its last tick (reached or not, the effect types it returned, the interval it chose,
the error it raised), as the engine last reported it to the UI's process. The history is
read from the log: the `promote` and `rollback` events this engine's directory recorded
(pulse_cli.directory_log), newest first. A rollback from the UI is the survival layer's
`Rollback` effect (see pulse_adapters.web._rules_rollback).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from pulse_adapters.web._responses import live, problem
from pulse_adapters.web._rules_rollback import (
    BadRollback,
    RollbackRefused,
    request_rollback,
    rollback_requests,
)
from pulse_adapters.web._state import WebState
from pulse_adapters.web._stream import Beat
from pulse_adapters.web._view import EngineView
from pulse_adapters.web._views import revision
from pulse_core import Event, RuleTrace

DIRECTORY_KINDS = ("promote", "rollback")
"""The kinds of the engine directory's events (pulse_cli.directory_log)."""
DIRECTORY_KEY = "engine-directory"
"""Their key in a log of one home's own; `engine-directory@<host>` where hosts share one log
(pulse_cli.directory_log.event_key, which pulse_adapters cannot import)."""
HISTORY_SHOWN = 100
"""The newest promotes and rollbacks the page lists."""
SURVIVAL, BUILTIN = "survival", "builtin"
"""The tiers the engine names itself (pulse_core._assembly); the others are layer names."""


def directory_key(host: str) -> str:
    """The key of the promote and rollback events of the engine directory bound to `host`."""
    return f"{DIRECTORY_KEY}@{host}" if host else DIRECTORY_KEY


def _decision(trace: RuleTrace) -> dict[str, Any]:
    return {"rule": trace.rule, "reached": trace.reached, "effects": list(trace.effects),
            "tick_ms": trace.tick_ms, "error": trace.error}


def tiers(engine: EngineView, business_revision: str | None) -> list[dict[str, Any]]:
    """The chain's tiers, outermost first, each with its rules' decisions in the last tick.

    Every tier of the engine is listed, also one without rules (a layer that only runs a
    service, business code with no rules); before the engine's first tick its report lists
    every rule, none reached."""
    layers = engine.report.layers
    business = layers[-1] if len(layers) > 1 else "business"
    rules: dict[str, list[dict[str, Any]]] = {
        name: [] for name in (SURVIVAL, BUILTIN, *layers[1:-1], business)}
    for trace in engine.trace:
        rules.setdefault(trace.tier, []).append(_decision(trace))
    return [{"tier": name, "kind": _kind(name, business), "fixed": name == SURVIVAL,
             "revision": business_revision if name == business else None, "rules": decided}
            for name, decided in rules.items()]


def _kind(tier: str, business: str) -> str:
    if tier == SURVIVAL:
        return "survival"
    if tier == BUILTIN:
        return "built-in"
    return "business" if tier == business else "layer"


def _backtest(found: Any) -> dict[str, Any] | None:
    """What a promote's backtest found, as the page shows it (None when none ran)."""
    if not isinstance(found, dict) or not isinstance(found.get("ticks"), int):
        return None
    first = found.get("first")
    return {"ticks": found["ticks"], "differing": found.get("differing", 0),
            "differs": found.get("differs", 0), "kinds": found.get("kinds", {}),
            "first": [t.get("tick") for t in first if isinstance(t, dict)]
            if isinstance(first, list) else []}


def _history_entry(event: Event, asked: dict[str, dict[str, Any]]) -> dict[str, Any]:
    data = event.data if isinstance(event.data, dict) else {}
    revision_now = data.get("revision")
    request = asked.get(revision_now) if event.kind == "rollback" and \
        isinstance(revision_now, str) else None
    return {"seq": event.seq, "kind": event.kind, "when": event.ts, "who": event.origin,
            "revision": revision_now, "previous": data.get("previous"), "to": data.get("to"),
            "reason": data.get("reason"), "kept": data.get("kept"),
            "staging": data.get("staging"), "migrated_from": data.get("migrated_from"),
            "backtest": _backtest(data.get("backtest")),
            "asked_by": request["origin"] if request else None,
            "effect": request["id"] if request else None}


async def history(engine: EngineView, requests: list[dict[str, Any]]
                  ) -> list[dict[str, Any]]:
    """This engine's promotes and rollbacks, newest first (HISTORY_SHOWN at most). A
    rollback made by one of the `Rollback` effects `requests` names who asked for it."""
    found = await engine.events.read(kinds=DIRECTORY_KINDS, key=directory_key(engine.placement),
                                     limit=HISTORY_SHOWN, newest_first=True)
    asked = {r["result"]["revision"]: r for r in requests
             if isinstance(r["result"], dict) and isinstance(r["result"].get("revision"), str)}
    return [_history_entry(event, asked) for event in found]


def last_good(entries: list[dict[str, Any]], main_has_parent: bool) -> dict[str, Any]:
    """Where a rollback without a revision goes (pulse_cli.rollback): the revision before
    the last promote; without a promote on record, main's parent commit. `possible` is
    false, and `why_not` says why, when that rollback would change nothing: main already
    has the files of the revision before the last promote (the newest event of the
    directory is a rollback to it), or no promote is on record and main has one commit."""
    for entry in entries:
        if entry["kind"] == "promote" and isinstance(entry["previous"], str):
            good = entry["previous"]
            newest = entries[0]
            done = newest["kind"] == "rollback" and newest["to"] == good
            return {"revision": good, "why": "the revision before the last promote "
                    f"(#{entry['seq']})", "possible": not done,
                    "why_not": f"main already has the files of {good[:12]} (rollback "
                               f"#{newest['seq']}): nothing to roll back" if done else None}
    return {"revision": None, "why": "main's parent commit (no promote is on record)",
            "possible": main_has_parent,
            "why_not": None if main_has_parent else
            "nothing to roll back: no promote is on record and main has a single commit"}


async def _main_has_parent(home: Path) -> bool:
    """Whether main of the engine directory (HOME/engine) has a parent commit; False when
    git cannot tell (no engine directory, no git)."""
    try:
        git = await asyncio.create_subprocess_exec(
            "git", "-C", str(home / "engine"), "rev-parse", "--verify", "--quiet", "HEAD~1",
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL)
    except OSError:
        return False
    return await git.wait() == 0


async def rule_chain(state: WebState) -> dict[str, Any]:
    """What the Rule chain page shows."""
    engine = state.engine
    running = revision(state.home)
    requests = await rollback_requests(state)
    entries = await history(engine, requests)
    promoted = any(e["kind"] == "promote" for e in entries)
    has_parent = engine.report.has_directory and not promoted and \
        await _main_has_parent(state.home)
    return {
        "tick": {"number": engine.ticks, "at": engine.last_tick_at,
                 "tick_ms": engine.last_tick_ms, "now": engine.clock.now_ms()},
        "revision": running, "has_directory": engine.report.has_directory,
        "tiers": tiers(engine, running), "history": entries,
        "last_good": last_good(entries, has_parent),
        "requests": requests,
        "stream": {"kinds": list(DIRECTORY_KINDS), "key": directory_key(engine.placement)},
    }


async def _recorded(engine: EngineView, request: dict[str, Any]) -> dict[str, Any] | None:
    """The `rollback` event the acked Rollback effect `request` made: one recorded after the
    effect, naming the revision the effect reports (None: main had the target's files
    already, so nothing was committed or recorded)."""
    result = request["result"]
    made = result.get("revision") if isinstance(result, dict) else None
    found = await engine.events.read(request["seq"], kinds=["rollback"],
                                     key=directory_key(engine.placement))
    return next((entry for entry in (_history_entry(e, {}) for e in found)
                 if made is not None and entry["revision"] == made), None)


def routes(state: WebState) -> list[BaseRoute]:
    """GET /api/rules, POST /api/rollback and the page's live stream /stream/rules."""
    rules_beat = Beat("rules", state.settings.live_every_s, lambda: rule_chain(state))

    async def api_rules(request: Request) -> Response:
        return JSONResponse(await rule_chain(state))

    async def stream_rules(request: Request) -> Response:
        return live(rules_beat.stream())

    async def api_rollback(request: Request) -> Response:
        try:
            done = await request_rollback(state, await request.body())
        except BadRollback as exc:
            return problem(400, str(exc))
        except RollbackRefused as exc:
            return JSONResponse({"error": str(exc), "effect": exc.effect}, status_code=409)
        if not done["finished"]:
            return JSONResponse(done, status_code=202)
        return JSONResponse({**done, "rollback": await _recorded(state.engine, done)})

    return [Route("/api/rules", api_rules), Route("/stream/rules", stream_rules),
            Route("/api/rollback", api_rollback, methods=["POST"])]
