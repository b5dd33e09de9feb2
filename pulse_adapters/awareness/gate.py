"""The deterministic gate: what the reviewer proposed, and what it may actually change."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from typing import Any

import msgspec

from pulse_adapters.awareness.config import AwarenessConfig
from pulse_adapters.awareness.contract import VALUE_BYTES, VALUE_DEPTH, VERBS
from pulse_core.maintenance import outranks
from pulse_core.memory import IdentityMemory, StateItem

_ORIGINATION = re.compile(
    r"(create|add|new|set|register|adopt|establish|form|invent|make)[_\- ]?"
    r"(identity|identities|belief|preference|goal|affect|mood|relationship|state|fact|memory)",
    re.I,
)
SHOWN_CHARS = 300
"""How much of a refused proposal, and of the reason, the cycle record keeps."""
WRITER = "executor:awareness"
"""The reviewer's origin: a background writer, outranked by a human's and the agent's."""


class Verb(msgspec.Struct, frozen=True):
    """An accepted change, in the gate's own terms."""

    verb: str
    target: str
    delta: float | None = None
    value: Any = None
    reason: str = ""


class Rejection(msgspec.Struct, frozen=True):
    """A proposal the gate refused, and why."""

    proposal: str
    reason: str


class GateResult(msgspec.Struct, frozen=True):
    """Accepted verbs and rejections with reasons, in proposal order."""

    accepted: tuple[Verb, ...]
    rejected: tuple[Rejection, ...]


def show_proposal(proposal: Any) -> str:
    """At most SHOWN_CHARS of `proposal` as JSON (else its repr), for a rejection record.
    Shared by every gate (the maintenance consolidation gate too): a proposal is untrusted,
    so nothing it is (recursive, nested past the recursion limit, a repr that raises, a
    lone surrogate) may raise here; what cannot be shown is named by its type."""
    try:
        text = msgspec.json.encode(proposal).decode()
    except Exception:  # recursion, unencodable types, lone surrogates
        try:
            text = repr(proposal)
        except Exception:  # a repr that raises or recurses too deep
            text = f"<a {type(proposal).__name__} that cannot be shown>"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")[:SHOWN_CHARS]


def _depth(value: Any) -> int:
    """Levels of arrays and objects in a decoded value (the envelope bounds the recursion)."""
    if isinstance(value, dict):
        return 1 + max(map(_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(_depth, value), default=0)
    return 0


def _oversized(value: Any) -> str | None:
    """Why a revise_value value is too deep or too large to store, or None."""
    if _depth(value) > VALUE_DEPTH:
        return f"a value nested deeper than {VALUE_DEPTH} levels"
    size = len(msgspec.json.encode(value))
    if size > VALUE_BYTES:
        return f"a value of {size:,} JSON bytes, larger than {VALUE_BYTES:,}"
    return None


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))


def _stands(target: str, item: StateItem, writer: str, reviewed_at: int) -> str | None:
    """Why a stronger writer's word on `item` stands against `writer`, or None: its last
    write outranks `writer` and is newer than the newest human exchange reviewed (a write in
    the same millisecond as that exchange counts as what the review saw)."""
    if not outranks(item.by, writer) or item.updated_at <= reviewed_at:
        return None
    return (f"{target} was set by {item.by} at {_when(item.updated_at)}, after the newest "
            f"exchange reviewed ({_when(reviewed_at)}): a stronger writer's word stands "
            "until the human says something newer")


def _check(proposal: Any, allowlist: frozenset[str], memory: IdentityMemory,
           config: AwarenessConfig, *, writer: str, reviewed_at: int) -> Verb | str:
    """The accepted Verb, or the reason for refusing the proposal."""
    if not isinstance(proposal, dict) or not isinstance(proposal.get("verb"), str):
        return "malformed proposal: need an object with a string 'verb'"
    verb = proposal["verb"]
    if _ORIGINATION.search(verb):
        return (f"{verb!r} would originate identity content (identities, beliefs, "
                "preferences, goals, new state): outside the reviewer's authority")
    if verb not in VERBS:
        return f"unknown verb {verb!r}; allowed: {', '.join(VERBS)}"
    target = proposal.get("target")
    if not isinstance(target, str):
        return "missing target"
    kind, _, record = target.partition(":")
    if target not in allowlist:
        if verb == "revise_value" and kind == "state" and record not in memory.state:
            return f"{target!r} would create a new state key: outside the reviewer's authority"
        return f"target {target!r} is not among the identifiers shown in the evidence"
    reason = str(proposal.get("reason", ""))[:200]
    if verb == "resolve":
        if kind != "unresolved" or record not in memory.unresolved:
            return "resolve applies to an unresolved item shown in the evidence"
        return Verb(verb, target, reason=reason)
    item = memory.state.get(record) if kind == "state" else None
    if item is None:
        return f"{verb} applies to a state item shown in the evidence"
    stands = _stands(target, item, writer, reviewed_at)
    if stands:
        return stands
    if verb == "adjust_confidence":
        delta = proposal.get("delta")
        if isinstance(delta, bool) or not isinstance(delta, int | float) or not math.isfinite(
                delta):
            return "adjust_confidence needs a numeric delta"
        if abs(delta) > config.confidence_step:
            return f"confidence change {delta:+g} is beyond ±{config.confidence_step:g}"
        if "confidence" in item.immutable:
            return f"{target}: confidence is immutable"
        return Verb(verb, target, delta=float(delta), reason=reason)
    if verb == "revise_value":
        if "value" not in proposal:
            return "revise_value needs a value"
        new = proposal["value"]
        oversized = _oversized(new)
        if oversized:
            return f"{target}: {oversized}"
        if "value" in item.immutable:
            return f"{target}: its value is immutable"
        if isinstance(item.value, dict):
            if not isinstance(new, dict):
                return f"{target}: a structured value can only be revised by an object"
            for field in item.immutable:
                if item.value.get(field) != new.get(field):
                    return f"{target}: field {field!r} is immutable"
        return Verb(verb, target, value=new, reason=reason)
    if item.protected:
        return f"{target} is protected: it cannot be retracted"
    return Verb(verb, target, reason=reason)


def gate(proposals: Sequence[Any], allowlist: frozenset[str], memory: IdentityMemory,
         config: AwarenessConfig, *, narration_only: bool = False, writer: str = WRITER,
         reviewed_at: int | None = None) -> GateResult:
    """Accept proposals that pass every check until `verb_budget` are accepted (refusals do not
    count against it); keep every refusal.

    `writer` is the origin the accepted verbs will be written with; `reviewed_at` the time of
    the newest human exchange in the evidence the proposals answer (default: the newest in
    `memory`). A state item whose last write outranks `writer` and is newer than that is not
    changed: the stronger writer's word stands until the human says something newer."""
    if reviewed_at is None:
        human = memory.last_human
        reviewed_at = human.ts if human else 0
    accepted: list[Verb] = []
    rejected: list[Rejection] = []
    touched: set[str] = set()
    for proposal in proposals:
        if len(accepted) >= config.verb_budget:
            outcome: Verb | str = (f"past the verb budget of {config.verb_budget} accepted "
                                   "verbs")
        elif narration_only:
            outcome = "narration-only degradation: proposals are discarded"
        else:
            outcome = _check(proposal, allowlist, memory, config, writer=writer,
                             reviewed_at=reviewed_at)
            if isinstance(outcome, Verb) and outcome.target in touched:
                outcome = f"{outcome.target} was already changed in this cycle"
        if isinstance(outcome, Verb):
            accepted.append(outcome)
            touched.add(outcome.target)
        else:
            rejected.append(Rejection(show_proposal(proposal), outcome[:SHOWN_CHARS]))
    return GateResult(tuple(accepted), tuple(rejected))
