"""Semantic consolidation (seed 004, sections 9 and 28): a proposer suggests derived
insights from an identity's unconsolidated memories; a deterministic gate decides.

The proposer (a model through `LlmProposer`, or any async callable) only proposes. The
gate accepts an insight when every input was shown to it, still exists and is active, and
the inputs reach at least `min_roots` distinct evidence roots: a summary (an insight, a
reflection, anything derived) is followed back to what it was derived from and never
counts as a root itself. Nothing outside the schema (text, inputs, salience) passes.
Each accepted insight is written in one append guarded by the identity's version: the
insight, the consolidated_to links of its sources, and its semantic_consolidation activity.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection, Sequence
from functools import partial
from typing import Any

import msgspec

from pulse_adapters.awareness import show_proposal
from pulse_core import EventDraft, InvalidEvent, PulseError, VersionConflict, check_text, uuid7
from pulse_core.maintenance import (
    ActivityBody,
    Consolidated,
    Element,
    ElementsReader,
    ElementsState,
    InsightRecorded,
    activity_draft,
    of_identity,
    retry_once,
)
from pulse_core.memory import identity_key
from pulse_core.store import EventStore, reveal

SOURCE_TYPES = ("exchange", "observation")
"""What consolidation picks as sources: exchanges and observations not consolidated yet."""
SUMMARY_TYPES = ("insight", "reflection")
"""Summaries: shown as context, followed to their roots, never counted as roots."""
FIELDS = frozenset({"text", "inputs", "salience"})
"""Everything a proposal may say; any other field (a predicate, a kind) is refused."""
TEXT_CHARS = 600
"""The longest insight text the gate accepts."""
ITEM_CHARS = 800
"""How much of each memory's text the proposer is shown."""
MAX_INPUTS = 16
"""The most inputs one insight may cite."""
CONTEXT_LIMIT = 10
"""The most existing summaries shown beside the sources."""
REPLY_CHARS, REPLY_DEPTH, PROPOSALS_MAX = 32_000, 8, 32
"""What a proposer's answer may be: characters of a model reply, its nesting (the envelope
uses three), and proposals read (the gate accepts `max_insights` of them)."""
PROPOSAL_DEPTH = REPLY_DEPTH - 2
"""How deep one proposal may nest, from any proposer: what a model's reply leaves a proposal
inside its envelope object and "insights" list (one object holding the inputs list uses two)."""
ROOT_DEPTH = 8
"""How far derived_from is followed to find roots."""


class BatchItem(msgspec.Struct, frozen=True):
    """One memory shown to the proposer: its element id, type, text and time."""

    id: str
    type: str
    text: str
    created_at: int


class ConsolidationBatch(msgspec.Struct, frozen=True):
    """What the proposer is shown: `sources` to consolidate and `context` (existing
    summaries it may cite, which never count as evidence roots)."""

    identity: str
    sources: tuple[BatchItem, ...]
    context: tuple[BatchItem, ...] = ()
    min_roots: int = 2
    max_insights: int = 4

    @property
    def shown(self) -> frozenset[str]:
        """The ids a proposal may cite."""
        return frozenset(i.id for i in (*self.sources, *self.context))


Proposer = Callable[[ConsolidationBatch], Awaitable[Sequence[Any]]]
"""Proposes insights for a batch: raw, untrusted proposals (dicts with text, inputs and
an optional salience); only the gate decides what they mean."""


class Insight(msgspec.Struct, frozen=True):
    """An accepted proposal, in the gate's terms: `roots` are its distinct evidence roots."""

    text: str
    inputs: tuple[str, ...]
    salience: float
    roots: tuple[str, ...]


class Rejection(msgspec.Struct, frozen=True):
    """A proposal the gate refused, and why."""

    proposal: str
    reason: str


class ConsolidationReport(msgspec.Struct, frozen=True):
    """What one consolidation of an identity did. `insights` are the element ids written;
    `deferred` proposals met a second version conflict; `error` says why the proposer gave
    nothing usable ("" when it answered)."""

    identity: str
    shown: int
    proposed: int = 0
    insights: tuple[str, ...] = ()
    rejected: tuple[Rejection, ...] = ()
    deferred: int = 0
    error: str = ""

    @property
    def accepted(self) -> int:
        """How many insights were written."""
        return len(self.insights)


class InvalidProposals(PulseError):
    """The model's reply is not the JSON envelope of insights the prompt asks for."""


def is_summary(element: Element) -> bool:
    """Whether `element` is derived (an insight, a reflection, anything with derived_from):
    never an independent evidence root."""
    return element.type in SUMMARY_TYPES or bool(element.derived_from)


def evidence_roots(state: ElementsState, inputs: Collection[str]) -> tuple[str, ...]:
    """The distinct evidence roots behind `inputs`: derived_from followed (ROOT_DEPTH hops)
    down to elements that are not summaries; roots sharing a payload digest count once."""
    roots: dict[str, str] = {}
    seen: set[str] = set()
    stack = [(eid, 0) for eid in inputs]
    while stack:
        eid, depth = stack.pop()
        element = state.elements.get(eid)
        if eid in seen or element is None:
            continue
        seen.add(eid)
        if not is_summary(element):
            roots.setdefault(element.digest or element.id, element.id)
        elif depth < ROOT_DEPTH:
            stack.extend((parent, depth + 1) for parent in element.derived_from)
    return tuple(sorted(roots.values()))


def _storable(text: str) -> str:
    """`text` with any lone surrogate escaped, so a report holding it can be stored."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _failure(exc: BaseException) -> str:
    """`exc` as "Type: message" for a report, even when its message cannot be made."""
    try:
        message = str(exc)
    except Exception:  # an untrusted proposer's exception: its __str__ may raise too
        message = "(its message cannot be shown)"
    return _storable(f"{type(exc).__name__}: {message}")[:500]


def _nested_deeper(value: Any, limit: int) -> bool:
    """Whether plain data nests lists and objects more than `limit` levels deep: the model
    path's rule (`nested_deeper` on the reply text), walked without recursion."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict | list):
            if level > limit:
                return True
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, level + 1) for child in children)
    return False


def _plain(raw: Any) -> tuple[Any, str]:
    """`raw` as plain data (dicts, lists, str, numbers: what a decoded model reply holds),
    so no method of a proposer's own types runs in the gate, and ""; or None and the reason
    it is refused."""
    try:
        plain = msgspec.to_builtins(raw)
    except Exception as exc:  # recursive, too deep for the recursion limit, unencodable
        return None, f"the proposal cannot be read as plain data ({_failure(exc)[:120]})"
    if _nested_deeper(plain, PROPOSAL_DEPTH):
        return None, f"the proposal is nested deeper than {PROPOSAL_DEPTH} levels"
    return plain, ""


def _unusable(element: Element | None, ours: Collection[str]) -> str | None:
    if element is None:
        return "does not exist (or was forgotten or purged)"
    if element.stage != "active":
        return f"is {element.stage}"
    if element.retracted or element.corrected_by is not None:
        return "was retracted or corrected: cite what replaced it"
    if element.stale:
        return "is a stale derivation under review"
    if not is_summary(element) and any(c not in ours for c in element.consolidated_to):
        return "is already consolidated"
    return None


def _check(raw: Any, state: ElementsState, shown: Collection[str], min_roots: int,
           ours: Collection[str]) -> Insight | str:
    """The insight `raw` proposes, or the reason it is refused."""
    raw, unreadable = _plain(raw)
    if unreadable:
        return unreadable
    if not isinstance(raw, dict):
        return "a proposal must be an object with text and inputs"
    unknown = sorted(str(k) for k in raw if k not in FIELDS)
    if unknown:
        return (f"fields outside the schema: {', '.join(unknown)[:100]} — only text, inputs "
                "and salience (no predicates, kinds or other claims are invented here)")
    text, inputs, salience = raw.get("text"), raw.get("inputs"), raw.get("salience", 0.5)
    if not isinstance(text, str) or not text.strip():
        return "text must be a non-empty string"
    if len(text) > TEXT_CHARS:
        return f"text has {len(text)} characters; at most {TEXT_CHARS}"
    try:
        check_text(text, "text", "the proposal")
    except InvalidEvent as exc:
        return str(exc)
    if (not isinstance(salience, (int, float)) or isinstance(salience, bool)
            or not 0.0 <= salience <= 1.0):
        return "salience must be a number within 0..1"
    if (not isinstance(inputs, list) or not inputs
            or not all(isinstance(i, str) for i in inputs)):
        return "inputs must be a non-empty list of element ids"
    cited = tuple(dict.fromkeys(inputs))
    if len(cited) > MAX_INPUTS:
        return f"{len(cited)} inputs; at most {MAX_INPUTS}"
    for eid in cited:
        if eid not in shown:
            return f"input {eid[:80]!r} was not in the batch shown"
        why = _unusable(state.elements.get(eid), ours)
        if why is not None:
            return f"input {eid[:80]!r} {why}"
    roots = evidence_roots(state, cited)
    if len(roots) < min_roots:
        return (f"{len(roots)} distinct evidence root(s); at least {min_roots} needed "
                "(a summary is never an independent root)")
    return Insight(text.strip(), cited, float(salience), roots)


def gate_insights(proposals: Sequence[Any], state: ElementsState, *,
                  shown: Collection[str], min_roots: int = 2, budget: int = 4,
                  ours: Collection[str] = ()) -> tuple[list[Insight], list[Rejection]]:
    """Accepted insights and refused proposals with reasons, in proposal order. Only ids
    in `shown` may be cited; past `budget` accepted ones, the rest are refused; `ours`
    are insights this run wrote (a source they consolidated may be cited again)."""
    accepted: list[Insight] = []
    rejected: list[Rejection] = []
    for raw in proposals:
        found = _check(raw, state, shown, min_roots, ours)
        if isinstance(found, str):
            rejected.append(Rejection(show_proposal(raw), _storable(found)))
        elif len(accepted) >= budget:
            rejected.append(Rejection(show_proposal(raw), f"over the budget of {budget} insights"))
        elif any(a.inputs == found.inputs and a.text == found.text for a in accepted):
            rejected.append(Rejection(show_proposal(raw), "repeats an accepted proposal"))
        else:
            accepted.append(found)
    return accepted, rejected


async def _item(store: EventStore, element: Element) -> BatchItem:
    """The element with the text of the event that created it (sealed text opened)."""
    found = await store.read(element.created_seq - 1, limit=1)
    event = found[0] if found and found[0].seq == element.created_seq else None
    data = event.data if event is not None and isinstance(event.data, dict) else {}
    data = await asyncio.to_thread(reveal, data, store.keys)
    if element.type == "observation":
        text = (f"{data.get('source', '')} observed {data.get('key', '')} = "
                f"{msgspec.json.encode(data.get('value')).decode()} "
                f"({data.get('severity', 'routine')})")
    else:
        text = str(data.get("text", ""))
    return BatchItem(element.id, element.type, text[:ITEM_CHARS], element.created_at)


async def build_batch(store: EventStore, state: ElementsState, identity: str, *, cutoff: int,
                      limit: int, min_roots: int = 2, max_insights: int = 4
                      ) -> ConsolidationBatch:
    """The identity's oldest `limit` active, unconsolidated exchanges and observations
    created before `cutoff`, with its newest active summaries as context."""
    live = [e for e in of_identity(state, identity) if _unusable(e, ()) is None]
    sources = [e for e in live if e.type in SOURCE_TYPES and e.created_at < cutoff][:limit]
    context = [e for e in live if is_summary(e)][-CONTEXT_LIMIT:]
    return ConsolidationBatch(
        identity, tuple([await _item(store, e) for e in sources]),
        tuple([await _item(store, e) for e in context]), min_roots, max_insights)


async def consolidate(store: EventStore, reader: ElementsReader, proposer: Proposer, *,
                      identity: str, now: int, origin: str = "executor:maintenance",
                      limit: int = 20, min_age_ms: int = 3_600_000, min_roots: int = 2,
                      max_insights: int = 4, cause: int | None = None) -> ConsolidationReport:
    """Consolidate `identity`'s sources older than `now - min_age_ms`: ask `proposer`,
    gate, and write each accepted insight (with cause `cause`) in one append with the
    identity's expected version (a conflict: re-read, re-gate, retry once; a second defers
    it). Fewer than `min_roots` sources: nothing is asked. A proposer that fails is
    reported, not raised."""
    state = await reader.current()
    batch = await build_batch(store, state, identity, cutoff=now - min_age_ms, limit=limit,
                              min_roots=min_roots, max_insights=max_insights)
    report = ConsolidationReport(identity, len(batch.sources) + len(batch.context))
    if len(batch.sources) < min_roots:
        return report
    try:
        answer = await proposer(batch)
    except Exception as exc:  # an untrusted proposer: its failure is the outcome
        return msgspec.structs.replace(report, error=_failure(exc))
    try:  # a list subclass may raise on iteration; each item is made plain by the gate
        proposals = list(answer) if isinstance(answer, list | tuple) else None
    except Exception as exc:
        return msgspec.structs.replace(
            report, error=f"the proposer's answer cannot be read: {_failure(exc)}")
    if proposals is None:
        return msgspec.structs.replace(report, error=f"the proposer returned a "
                                       f"{type(answer).__name__}, not a list of proposals")
    accepted, rejected = gate_insights(proposals[:PROPOSALS_MAX], state, shown=batch.shown,
                                       min_roots=min_roots, budget=max_insights)
    if len(proposals) > PROPOSALS_MAX:
        rejected.append(Rejection("", f"{len(proposals) - PROPOSALS_MAX} proposals past the "
                                      f"first {PROPOSALS_MAX} were not read"))
    writer = _Writer(store, reader, batch, origin, now, cause=cause)
    deferred = 0
    for insight in accepted:
        try:
            outcome = await retry_once(partial(writer.write, insight))
        except VersionConflict:
            deferred += 1
            continue
        if isinstance(outcome, Rejection):
            rejected.append(outcome)
    return msgspec.structs.replace(report, proposed=len(proposals),
                                   insights=tuple(writer.written), rejected=tuple(rejected),
                                   deferred=deferred)


class _Writer:
    """Writes accepted insights of one batch, each re-gated against the state as it is."""

    def __init__(self, store: EventStore, reader: ElementsReader, batch: ConsolidationBatch,
                 origin: str, now: int, *, cause: int | None) -> None:
        self.store, self.reader, self.batch = store, reader, batch
        self.origin, self.now, self.cause = origin, now, cause
        self.written: list[str] = []

    async def write(self, insight: Insight) -> str | Rejection:
        """Write `insight` in one append guarded by the identity's version; its element id,
        or the rejection the fresh state gives it."""
        state = await self.reader.current()
        identity, origin, cause = self.batch.identity, self.origin, self.cause
        again = _check({"text": insight.text, "inputs": list(insight.inputs),
                        "salience": insight.salience}, state, self.batch.shown,
                       self.batch.min_roots, self.written)
        if isinstance(again, str):
            return Rejection(show_proposal(msgspec.to_builtins(insight)), f"on write: {again}")
        record = f"i-{uuid7()}"
        eid = f"{identity}/{record}"
        activity = f"semantic_consolidation:{uuid7()}"
        key = identity_key(identity)
        drafts = [
            EventDraft("insight-recorded", key, msgspec.to_builtins(InsightRecorded(
                record=record, text=again.text, derived_from=again.inputs, activity=activity,
                salience=again.salience)), origin=origin, cause=cause),
            EventDraft("element-consolidated", key, msgspec.to_builtins(Consolidated(
                records=again.inputs, to=eid)), origin=origin, cause=cause),
            activity_draft(activity, ActivityBody(
                activity_class="semantic_consolidation", actors=(origin,),
                inputs=again.inputs, outputs=(eid,), started_at=self.now,
                ended_at=self.now, report={"roots": list(again.roots)}), origin=origin,
                cause=cause),
        ]
        await self.store.append(drafts, expect={key: state.versions.get(identity, 0)})
        self.written.append(eid)
        return eid
