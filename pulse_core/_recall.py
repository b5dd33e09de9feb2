"""One recall: the memory elements the agent may use now, by identity, topic or text, ranked
(docs/memory.md, "Recall"). Maintenance decides what recall sees: an archived element leaves
ordinary recall, a tombstoned, purged, forgotten or quarantined one never returns."""

from __future__ import annotations

import heapq
from collections.abc import Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from pulse_core._errors import RecallRefused, UnknownIdentity
from pulse_core._events import Event
from pulse_core._pmap import PersistentMap
from pulse_core.store import (
    ElementKeys,
    EventStore,
    is_sealed,
    reveal,
    sealed_element,
    text_words,
)

if TYPE_CHECKING:
    from pulse_core.maintenance import Element, ElementsState
    from pulse_core.memory import IdentityMemory

MAX_LIMIT = 1_000
TYPES = ("exchange", "state", "unresolved", "observation", "fact", "reflection")


class RecallQuery(msgspec.Struct, frozen=True, kw_only=True):
    """What to recall. At least one of `identity`, `topic` or `text` must be given.

    - `identity`: only this identity's elements (UnknownIdentity when it has none);
    - `topic`: elements about a topic: a state item named so, an observation with that key
      or source (case-insensitive, exact);
    - `text`: every word must occur in the element's text (case-insensitive);
    - `limit`: at most this many, 1..1000 (default 10);
    - `include_archived`: archived elements too (ordinary recall leaves them out);
    - `types`: only these types (of TYPES; empty: every type).
    """

    identity: str | None = None
    topic: str | None = None
    text: str | None = None
    limit: int = 10
    include_archived: bool = False
    types: tuple[str, ...] = ()


class Recalled(msgspec.Struct, frozen=True, kw_only=True):
    """One recalled element: its identity and record, its type (exchange, state, unresolved,
    observation, fact, reflection), its text as the agent reads it (a state item's or an
    observation's value rendered as text), and what ranked it: the writer's authority
    (pulse_core.maintenance.rank: HUMAN 3, AGENT 2, BACKGROUND 1), the state item's
    confidence (1.0 for other types), its memory strength, `score` (confidence x strength),
    its retention stage and when it was last written (ms)."""

    identity: str
    record: str
    type: str
    text: str
    authority: int
    confidence: float
    strength: float
    stage: str
    at: int
    score: float


def query_words(query: RecallQuery) -> tuple[str, ...]:
    """The words `query.text` searches for (none without a text); RecallRefused names a
    malformed field."""
    if not isinstance(query.limit, int) or not 1 <= query.limit <= MAX_LIMIT:
        raise RecallRefused("limit", f"limit {query.limit!r} is outside 1..{MAX_LIMIT}")
    for field in ("identity", "topic", "text"):
        value = getattr(query, field)
        if value is not None and (not isinstance(value, str) or not value.strip()):
            raise RecallRefused(field, f"{field} must be a non-empty string or None")
    unknown = [t for t in query.types if t not in TYPES]
    if unknown:
        raise RecallRefused("types", f"unknown type(s) {unknown}: give some of {TYPES}")
    if query.identity is None and query.topic is None and query.text is None:
        raise RecallRefused("query", "give an identity, a topic or a text to recall by")
    if query.text is None:
        return ()
    words = tuple(text_words(query.text))
    if not words:
        raise RecallRefused("text", f"text {query.text!r} holds no word to search for")
    return words


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return msgspec.json.encode(value).decode()


_Candidate = tuple[str, str, str, str, float, str, int, Any]


def _candidates(mem: IdentityMemory) -> list[_Candidate]:
    """(record, type, text, topic words, confidence, writer, at, the stored text value) of
    one identity's memory; the stored value is a sealed token when the keys sealed it."""
    found: list[_Candidate] = []
    for x in mem.exchanges:
        found.append((x.record, "exchange", x.text, "", 1.0, "", x.ts, x.text))
    for name, item in mem.state.items():
        found.append((item.record, "state", f"{name}: {_as_text(item.value)}", name,
                      item.confidence, item.by, item.updated_at, item.value))
    for u in mem.unresolved.values():
        found.append((u.record, "unresolved", u.text, "", 1.0, "", u.opened_at, u.text))
    for o in mem.observations.values():
        found.append((o.record, "observation", f"{o.source}.{o.key}: {_as_text(o.value)}",
                      f"{o.source}\n{o.key}", 1.0, o.origin, o.at, o.value))
    for f in mem.facts.values():
        found.append((f.record, "fact", f.text, "", 1.0, "", f.ts, f.text))
    if mem.reflection is not None:
        r = mem.reflection
        found.append((r.record, "reflection", r.text, "", 1.0, "", r.ts, r.text))
    return found


class _Split(NamedTuple):
    """One identity's candidates as a text recall visits them: the sealed ones by record
    (the index names those it found), the plain ones apart (the index does not hold them),
    for the memory they were made of."""

    memory: IdentityMemory
    sealed: dict[str, list[_Candidate]]
    plain: tuple[_Candidate, ...]


def _split(mem: IdentityMemory) -> _Split:
    sealed: dict[str, list[_Candidate]] = {}
    plain: list[_Candidate] = []
    for candidate in _candidates(mem):
        if is_sealed(candidate[7]):
            sealed.setdefault(candidate[0], []).append(candidate)
        else:
            plain.append(candidate)
    return _Split(mem, sealed, tuple(plain))


class Candidates:
    """Each identity's candidates for a text recall, kept for the memory they were made of:
    a Recaller keeps one, so an identity's are made again only once a fold changed its
    memory. Kept for a recall that visits at most `keep` identities, and for at most `keep`
    at a time (all are let go once that many are kept)."""

    def __init__(self, keep: int = 256) -> None:
        self.keep = keep
        self._made: dict[str, _Split] = {}

    def of(self, identity: str, mem: IdentityMemory) -> _Split:
        """`identity`'s candidates, its memory being `mem`."""
        made = self._made.get(identity)
        if made is None or made.memory is not mem:
            made = _split(mem)
            if len(self._made) >= self.keep:
                self._made = {}  # rebound, not cleared: a selection beside this one reads on
            self._made[identity] = made
        return made


def _holds(text: str, words: tuple[str, ...]) -> bool:
    """Whether every one of `words` starts a word of `text` (the index's prefix match)."""
    found = text_words(text)
    return all(any(t.startswith(w) for t in found) for w in words)


def rank_key(authority: int, score: float, at: int, identity: str, record: str
             ) -> tuple[int, float, int, str, str]:
    """Where a recalled element sorts, best first: authority, then confidence x strength,
    then the newest (identity and record make the order total)."""
    return -authority, -score, -at, identity, record


class Observed(NamedTuple):
    """The identities of `memory` holding observations: plain text, which the keys' index
    does not hold, so a text recall scans them whatever the index found."""

    memory: PersistentMap[str, IdentityMemory]
    identities: frozenset[str]

    def of(self, memory: PersistentMap[str, IdentityMemory]) -> Observed:
        """The same for `memory`, a later fold: only the identities it changed are looked at."""
        if memory is self.memory:
            return self
        found = set(self.identities)
        for identity in memory.changed_keys(self.memory):
            mem = memory.get(identity)
            if mem is not None and mem.observations:
                found.add(identity)
            else:
                found.discard(identity)
        return Observed(memory, frozenset(found))


NOTHING_OBSERVED = Observed(PersistentMap(), frozenset())


def select(memory: PersistentMap[str, IdentityMemory], elements: ElementsState,
           query: RecallQuery, keys: ElementKeys | None = None, *,
           observed: Observed = NOTHING_OBSERVED, candidates: Candidates | None = None,
           verified: Mapping[str, bool] | None = None,
           import_origins: Iterable[str] | None = None) -> list[Recalled]:
    """The recall of `query` over a folded `memory` map and elements state (blocking: it
    opens sealed text with `keys`); `observed` of an earlier fold saves finding again the
    identities with observations, `candidates` making again the candidates of an identity
    whose memory did not change; `verified`: the imported elements a person verified
    (VerifiedImports; None: none), the others of writers under `import_origins` (default
    pulse_core.maintenance.IMPORT_ORIGINS) ranked as a background writer's."""
    from pulse_core._memory_text import reveal_memory
    from pulse_core.maintenance import IMPORT_ORIGINS, element_id, import_rank

    words = query_words(query)
    # sealed text is searched in the keys' FTS5 index; what it does not hold (plain text:
    # observations, a store without keys) is matched word by word here, the same way
    # (and when it finds no more than the recall returns, their keys in the same statement)
    search = keys.search_keyed(words, query.limit) if words and keys is not None else None
    indexed = None if search is None else search.elements
    identities, found = _where(memory, query.identity, indexed, observed)
    topic = query.topic.strip().lower() if query.topic else None
    stages = ("active", "archived") if query.include_archived else ("active",)
    verified = verified or {}
    origins = tuple(IMPORT_ORIGINS if import_origins is None else import_origins)
    nothing: set[str] = set()
    authorities: dict[tuple[str, bool], int] = {}
    # what matched, as (rank key, candidate, authority, strength, stage, score): a Recalled
    # is made only for what is returned
    out: list[tuple[tuple[int, float, int, str, str], _Candidate, int, float, str, float]] = []
    # the candidates of a few identities are kept (`candidates`), their sealed ones by
    # record: only the records the index found are looked up; a recall visiting more
    # identities (a common word) filters each one's records instead
    kept = candidates if candidates is not None and indexed is not None \
        and len(identities) <= candidates.keep else None
    for identity in identities:
        mem = memory[identity]
        opened = None
        hits = None if indexed is None else found.get(identity, nothing)
        for candidate in _visited(identity, mem, hits, kept):
            record, kind, text, topics, conf, writer, at, sealed = candidate
            if query.types and kind not in query.types:
                continue
            if topic is not None and topic not in topics.lower().split("\n"):
                continue
            eid = element_id(identity, record)
            element = elements.elements.get(eid)
            stage = _visible(eid, element, elements, stages)
            if stage is None:
                continue
            if words:
                if not is_sealed(sealed):
                    if not _holds(text, words):
                        continue
                elif indexed is None:
                    if opened is None:
                        opened = {c[0]: c[2] for c in _candidates(reveal_memory(mem, keys))}
                    if not _holds(opened[record], words):
                        continue
            strength = element.strength if element is not None else 1.0
            by = (writer or (element.writer if element is not None else ""), eid in verified)
            authority = authorities.get(by)
            if authority is None:
                authority = authorities[by] = import_rank(*by, origins)
            score = round(conf * strength, 6)
            out.append((rank_key(authority, score, at, identity, record), candidate,
                        authority, strength, stage, score))
    best = heapq.nsmallest(query.limit, out, key=_first)
    # only what is returned is opened: its keys read in one statement (unless the search
    # read them), a decryption each
    known = search.keys if search is not None else None
    if known is None and keys is not None:
        known = keys.keys_of(sealed_element(m[1][7]) for m in best if is_sealed(m[1][7]))
    return [Recalled(identity=key[3], record=key[4], type=kind,
                     text=_opened(text, stored, keys, known), authority=authority,
                     confidence=conf, strength=strength, stage=stage, at=at, score=score)
            for key, (_, kind, text, _, conf, _, at, stored), authority, strength, stage, score
            in best]


def _visited(identity: str, mem: IdentityMemory, hits: set[str] | None,
             kept: Candidates | None) -> list[_Candidate]:
    """The candidates of `identity` (its memory `mem`) a recall looks at: with `hits` (the
    records the index found) the sealed ones among them and the plain ones, else all."""
    if hits is None:
        return _candidates(mem)
    if kept is None:
        return [c for c in _candidates(mem) if c[0] in hits or not is_sealed(c[7])]
    split = kept.of(identity, mem)
    visited = [c for record in hits for c in split.sealed.get(record, ())]
    visited.extend(split.plain)
    return visited


def _first(match: tuple[Any, ...]) -> Any:
    return match[0]


def _opened(text: str, stored: Any, keys: ElementKeys | None, known: Mapping[str, bytes] | None
            ) -> str:
    """`text`, a candidate's text ending with its stored value, with that value opened."""
    if keys is None or (isinstance(stored, str) and not is_sealed(stored)):
        return text
    if text is stored and known:  # an exchange's, a fact's...: the text is the token
        key = known.get(sealed_element(stored))
        if key is not None:  # as `reveal` opens it with a key at hand
            return _as_text(keys.open(stored, key))
    opened = _as_text(reveal(stored, keys, known=known))
    return text[: len(text) - len(_as_text(stored))] + opened


def _where(memory: PersistentMap[str, IdentityMemory], identity: str | None,
           indexed: set[str] | None, observed: Observed
           ) -> tuple[Collection[str], dict[str, set[str]]]:
    """The identities a recall visits (`identity`, or all of them, or those the index found
    and those holding plain text), and the records of each the index found."""
    if identity is not None:
        if identity not in memory:
            raise UnknownIdentity(identity)
        if indexed is None:
            return [identity], {}
        prefix = identity + "/"
        return [identity], {identity: {e[len(prefix):] for e in indexed
                                       if e.startswith(prefix)}}
    if indexed is None:
        return memory.keys(), {}
    found = _records_by_identity(indexed, memory)
    return found.keys() | observed.of(memory).identities, found


def _records_by_identity(eids: Iterable[str], memory: PersistentMap[str, IdentityMemory]
                         ) -> dict[str, set[str]]:
    """The records of `eids` by the identity of `memory` each is of (an element id is
    "<identity>/<record>", and an identity id may hold '/' too: each part before a '/' that
    `memory` holds is one)."""
    found: dict[str, set[str]] = {}
    for eid in eids:
        at = eid.find("/")
        while at >= 0:
            records = found.get(eid[:at])
            if records is None:
                records = found[eid[:at]] = set()
            records.add(eid[at + 1:])
            at = eid.find("/", at + 1)
    return {identity: records for identity, records in found.items() if identity in memory}


def _visible(eid: str, element: Element | None, elements: ElementsState,
             stages: tuple[str, ...]) -> str | None:
    """The stage `eid` (`element`: its entry in `elements`) is recalled at, None when recall
    leaves it out."""
    if eid in elements.purged or eid in elements.forgotten:
        return None
    if element is None:
        return "active"  # not (yet) an element: nothing maintenance decided about it
    return element.stage if element.stage in stages and not element.retracted else None


def recallable_form(memory: IdentityMemory, elements: ElementsState, *,
                    include_archived: bool = False) -> IdentityMemory:
    """`memory` without what ordinary recall leaves out: archived records (unless
    `include_archived`), tombstoned and purged ones (forgotten and quarantined ones are
    already gone from `memory`)."""
    from pulse_core.maintenance import element_id

    stages = ("active", "archived") if include_archived else ("active",)
    eids = {c[0]: element_id(memory.identity, c[0]) for c in _candidates(memory)}
    keep = {record for record, eid in eids.items()
            if _visible(eid, elements.elements.get(eid), elements, stages) is not None}
    replace = msgspec.structs.replace
    return replace(
        memory,
        exchanges=tuple(x for x in memory.exchanges if x.record in keep),
        state={k: v for k, v in memory.state.items() if v.record in keep},
        unresolved={k: v for k, v in memory.unresolved.items() if k in keep},
        observations={k: v for k, v in memory.observations.items() if k in keep},
        facts={k: v for k, v in memory.facts.items() if k in keep},
        reflection=memory.reflection if memory.reflection is None
        or memory.reflection.record in keep else None)


async def recallable(store: EventStore, memory: IdentityMemory, *,
                     include_archived: bool = False) -> IdentityMemory:
    """`memory` (an identity's current form) as recall sees it: the records maintenance
    archived (unless `include_archived`), tombstoned or purged are left out. Reads the
    identity's key once to fold its elements' stages; what reads memory to show it to a
    model reads it through this, or through `recallable_from_events` when it has read the
    key already (the awareness reviewer's evidence and allowlist)."""
    from pulse_core.memory import identity_key

    events = await store.read(key=identity_key(memory.identity))
    return recallable_from_events(memory, events, include_archived=include_archived)


def recallable_from_events(memory: IdentityMemory, events: Iterable[Event], *,
                           include_archived: bool = False) -> IdentityMemory:
    """What `recallable` gives, from the identity key's events already read (all of them,
    oldest first) instead of reading the key again."""
    from pulse_core.maintenance import MemoryElements

    fold = MemoryElements()
    elements = fold.initial()
    for event in events:
        elements = fold.apply(elements, event)
    return recallable_form(memory, elements, include_archived=include_archived)
