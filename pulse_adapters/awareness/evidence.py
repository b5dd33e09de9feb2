"""CYCLE_EVIDENCE: the bounded, escaped, identified data a review may see, and its allowlist."""

from __future__ import annotations

import re
from typing import Any

import msgspec

from pulse_adapters.awareness.config import AwarenessConfig
from pulse_core.memory import IdentityMemory

OPEN = "<<<CYCLE_EVIDENCE"
CLOSE = "CYCLE_EVIDENCE>>>"
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_SEVERITY_RANK = {"critical": 0, "warning": 1, "notice": 2, "routine": 3}


def clean(text: Any, limit: int) -> str:
    """Text made safe to show as data: control characters and delimiters removed, bounded."""
    out = _CONTROL.sub("", str(text))
    out = out.replace("<<<", "< < <").replace(">>>", "> > >")
    return out if len(out) <= limit else out[: limit - 1] + "…"


def _value(value: Any, limit: int) -> Any:
    if isinstance(value, str):
        return clean(value, limit)
    if isinstance(value, bool | int | float) or value is None:
        return value
    return clean(msgspec.json.encode(value).decode(), limit)


class Evidence(msgspec.Struct, frozen=True):
    """What one review sees: the rendered envelope, the identifiers it may act on, and the
    counts the ledger keeps (shown, and available before the caps)."""

    text: str
    allowlist: frozenset[str]
    counts: dict[str, int]
    available: dict[str, int]
    observation_ids: tuple[str, ...]
    source: str | None


def build_evidence(memory: IdentityMemory, config: AwarenessConfig) -> Evidence:
    """Rank and cap each kind, render it as JSON data between delimiters, and shrink until the
    whole envelope fits `envelope_chars`. The allowlist is exactly the rendered state and
    unresolved identifiers."""
    limit = config.field_chars
    caps = config.caps
    state = sorted(memory.state.values(),
                   key=lambda s: (not s.protected, -s.confidence, -s.updated_at))
    unresolved = sorted(memory.unresolved.values(), key=lambda u: (-u.priority, -u.opened_at))
    latest: dict[tuple[str, str], Any] = {}
    for obs in memory.observations.values():
        latest[(obs.source, obs.key)] = obs
    observations = sorted(latest.values(), key=lambda o: (_SEVERITY_RANK.get(o.severity, 9),
                                                         -o.at))
    facts = sorted(memory.facts.values(), key=lambda f: -f.ts)
    exchanges = list(memory.exchanges)
    available = {"exchanges": len(exchanges), "state": len(state),
                 "unresolved": len(unresolved), "observations": len(observations),
                 "facts": len(facts)}
    shown = {"exchanges": min(caps.exchanges, len(exchanges)),
             "state": min(caps.state, len(state)),
             "unresolved": min(caps.unresolved, len(unresolved)),
             "observations": min(caps.observations, len(observations)),
             "facts": min(caps.facts, len(facts))}
    while True:
        body = {
            "identity": clean(memory.identity, 100),
            "recent_exchanges": [
                {"role": clean(x.role, 20), "text": clean(x.text, limit)}
                for x in exchanges[len(exchanges) - shown["exchanges"]:]],
            "latest_reflection": clean(memory.reflection.text, limit)
            if memory.reflection else None,
            "state": [
                {"id": f"state:{s.record}", "value": _value(s.value, limit),
                 "confidence": round(s.confidence, 3), "protected": s.protected,
                 "immutable_fields": list(s.immutable)}
                for s in state[: shown["state"]]],
            "unresolved": [
                {"id": f"unresolved:{u.record}", "text": clean(u.text, limit),
                 "priority": u.priority} for u in unresolved[: shown["unresolved"]]],
            "observations": [
                {"source": clean(o.source, 80), "key": clean(o.key, 80),
                 "severity": o.severity, "routine": o.routine, "value": _value(o.value, limit)}
                for o in observations[: shown["observations"]]],
            "temporal_facts": [clean(f.text, limit) for f in facts[: shown["facts"]]],
        }
        rendered = msgspec.json.encode(body).decode()
        if len(rendered) <= config.envelope_chars or not any(shown.values()):
            break
        for kind in ("observations", "facts", "exchanges", "unresolved", "state"):
            if shown[kind]:
                shown[kind] -= 1
                break
    allowlist = frozenset(
        [f"state:{s.record}" for s in state[: shown["state"]]]
        + [f"unresolved:{u.record}" for u in unresolved[: shown["unresolved"]]])
    human = memory.last_human
    return Evidence(
        text=f"{OPEN}\n{rendered}\n{CLOSE}", allowlist=allowlist, counts=shown,
        available=available,
        observation_ids=tuple(o.record for o in observations[: shown["observations"]]),
        source=human.record if human else None)
