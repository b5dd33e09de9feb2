"""A rollback asked for from the UI: pulse_core's `Rollback` effect, appended to the log for
the engine's executor loop to run (the survival layer's executor runs it).

The UI's process cannot roll back itself (it opens the home read-only, and the engine
directory is the engine's): the engine's RollbackExecutor calls its engine directory, which
commits the revert in git, records the `rollback` event and, in the daemon, asks for a reload
that restarts this very process. So the request waits (ROLLBACK_WAIT_S at most) for the
effect to finish and answers with its outcome — a refusal (a revision main does not have)
comes back as the error it failed with — and the reload follows the answer: the executor
acks the effect before the daemon closes the engine and the UI with it. One request at a
time: a second one while a rollback is unfinished (asked for here, by a survival rule or from
another UI) is refused, naming it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec

from pulse_adapters.web._state import WebState
from pulse_core import (
    EffectEntry,
    EffectStatus,
    PulseError,
    Rollback,
    effect_draft,
    fold_effect,
)

ORIGIN = "human:web"
"""Who asks for the UI's rollbacks (the origin of the operator's effect controls, too)."""
ROLLBACK_WAIT_S = 15.0
"""How long a request waits for its rollback to finish (two attempts, a git commit each)."""
POLL_S = 0.2
REASON_CHARS = 500
REVISION_CHARS = 100


class BadRollback(PulseError):
    """A rollback request whose body is not {"revision": null | "<rev>", "reason": "..."}."""


class RollbackRefused(PulseError):
    """The rollback was not made: no engine directory, another one unfinished, or the
    engine directory refused it. `effect` names the effect concerned, when there is one."""

    def __init__(self, message: str, effect: str | None = None) -> None:
        super().__init__(message)
        self.effect = effect


def request_json(entry: EffectEntry) -> dict[str, Any]:
    """A Rollback effect as the page lists it."""
    body = entry.data.get("effect") if isinstance(entry.data, dict) else None
    body = body if isinstance(body, dict) else {}
    return {"id": entry.id, "seq": entry.seq, "status": str(entry.status),
            "origin": entry.origin, "revision": body.get("revision"),
            "reason": body.get("reason"), "emergency": bool(body.get("emergency")),
            "attempt": entry.attempt, "created_at": entry.created_at,
            "updated_at": entry.updated_at, "result": entry.result, "error": entry.error,
            "finished": entry.finished}


async def rollback_requests(state: WebState) -> list[dict[str, Any]]:
    """Every Rollback effect the UI's LogBook keeps (unfinished, failed, cancelled, recently
    acked) that this engine may run (bound to its host, or to none), newest first."""
    await state.book.catch_up(frozenset(state.engine.report.survival_tags))
    hosts = ("", state.engine.placement)
    found = [e for e in state.book.effects.values()
             if e.tag == Rollback.tag() and e.host in hosts]
    found.sort(key=lambda e: e.seq, reverse=True)
    return [request_json(e) for e in found]


def parse_request(raw: bytes) -> Rollback:
    """The Rollback a request body asks for; BadRollback says what is wrong with it."""
    shape = ('send {"revision": null, "reason": "..."} (null: the last known good revision) '
             'or {"revision": "<a revision of main>", "reason": "..."}')
    try:
        body = msgspec.json.decode(raw) if raw.strip() else None
    except msgspec.DecodeError as exc:
        raise BadRollback(f"the body is not JSON ({exc}): {shape}") from None
    if not isinstance(body, dict):
        raise BadRollback(f"the body must be a JSON object: {shape}")
    unknown = sorted(set(body) - {"revision", "reason"})
    if unknown:
        raise BadRollback(f"unknown field(s) {', '.join(unknown)}: {shape}")
    revision, reason = body.get("revision"), body.get("reason")
    if revision is not None and (not isinstance(revision, str) or not revision.strip()
                                 or len(revision) > REVISION_CHARS
                                 or any(c.isspace() for c in revision.strip())):
        raise BadRollback(f"`revision` {revision!r} is not a revision (a commit id or name "
                          f"of at most {REVISION_CHARS} characters, no spaces): {shape}")
    if not isinstance(reason, str) or not reason.strip():
        raise BadRollback(f"`reason` is required: say why you roll back; {shape}")
    if len(reason) > REASON_CHARS:
        raise BadRollback(f"`reason` has {len(reason)} characters: keep it to {REASON_CHARS}")
    return Rollback(reason=reason.strip(), revision=revision.strip() if revision else None)


async def request_rollback(state: WebState, raw: bytes) -> dict[str, Any]:
    """Append the Rollback effect `raw` asks for and wait for its outcome (see the module's
    docstring): its request_json, `finished` false when it was still under way after
    ROLLBACK_WAIT_S. RollbackRefused when it was not made."""
    effect = parse_request(raw)
    engine = state.engine
    if not engine.report.has_directory:
        raise RollbackRefused("this engine runs without an engine directory, so there is "
                              "nothing to roll back: the daemon of a home made by `upulse "
                              "init` has one (HOME/engine)")
    if state.rollback_lock.locked():
        raise RollbackRefused("a rollback asked for from this UI is under way: wait for its "
                              "outcome, then ask again if you still need one")
    async with state.rollback_lock:
        unfinished = [r for r in await rollback_requests(state) if not r["finished"]]
        if unfinished:
            busy = unfinished[0]
            raise RollbackRefused(f"rollback {busy['id']} (asked by {busy['origin']}) is "
                                  f"{busy['status']}: wait for its outcome, then ask again if "
                                  "you still need one", busy["id"])
        try:
            (event,) = await engine.append([effect_draft(effect, ORIGIN,
                                                         host=engine.placement)])
        except PulseError as exc:
            raise RollbackRefused(f"the rollback could not be asked for: the log refused its "
                                  f"effect ({exc})") from exc
        entry = await _outcome(state, fold_effect(None, event))
    found = request_json(entry)
    if entry.status is EffectStatus.ACKED or not entry.finished:
        return found
    raise RollbackRefused(f"the rollback failed: {entry.error}", entry.id)


async def _outcome(state: WebState, entry: EffectEntry | None) -> EffectEntry:
    """The effect `entry` once it finished, or as it stands after ROLLBACK_WAIT_S."""
    assert entry is not None
    events = state.engine.events
    loop = asyncio.get_running_loop()
    deadline = loop.time() + ROLLBACK_WAIT_S
    seen = entry.seq
    while not entry.finished and loop.time() < deadline:
        await asyncio.sleep(POLL_S)
        for event in await events.read(seen, key=entry.id):
            entry, seen = fold_effect(entry, event) or entry, event.seq
    return entry
