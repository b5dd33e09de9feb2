"""Seed 004's SelfModel refresh (cycle step 11): a bounded summary of what the agent holds
about itself, rebuilt deterministically (no model) from the memory of the self identity.

Its entries are that identity's current state items (a name `<category>:<name>` files it
under its category: `preference:tone`, `capability:python`), facts and reflection. Dropped:
what is archived, tombstoned, corrected, a fact whose `valid_until` has passed (superseded);
retracted, forgotten, quarantined and purged records are already gone from the memory.
Duplicates (one category, the same name and text, case and spacing aside) merge into one
entry that counts its support. Contradictions are noted, never resolved: the self
identity's contested belief slots, and one name holding different texts. Imported entries
no person verified stay out, and so do claims to authority (grants are authority; a belief
about oneself is not). Like the working state, a view served with its basis, never
evidence, and written only when it changed."""

from __future__ import annotations

import asyncio
import datetime
from collections import defaultdict
from collections.abc import Callable, Collection, Sequence
from typing import Any

import msgspec

from pulse_adapters.maintenance._context import CycleRun
from pulse_adapters.maintenance._imports import ImportReviews
from pulse_adapters.maintenance._settings import ORIGIN, PRINCIPAL
from pulse_core import ElementTextUnreadable, EventDraft, EventStore, Memory, register_kind
from pulse_core.maintenance import (
    BACKGROUND,
    ActivityBody,
    ElementsState,
    activity_draft,
    element_id,
    imported,
    rank,
)
from pulse_core.memory import IdentityMemory, identity_key
from pulse_core.store import ElementKeys, reveal

SELF_MODEL = "self-model-refreshed"
SELF_MODEL_KEY = "self-model:self"
MAX_RENDER = 4_000  # characters of a rendered summary
ENTRY_CHARS = 200  # characters of one rendered entry's text
NOTHING_KNOWN = "Nothing held about the self yet."
AUTHORITY_CATEGORIES = frozenset({"authority", "grant", "grants", "permission", "permissions"})
"""Categories a self-model never lists: a claim to authority is not authority (grants are)."""
REFRESH_CLASS = "self_model_refresh"


class SelfModelEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One entry: the element it was kept from, its category and name, its text as stored
    (sealed in a home: purging the element makes it unreadable here too), its writer and
    time, its `authority` (the writer's rank; an import's is always BACKGROUND, verified or
    not: imported authority does not transfer), and `support`: how many records said the
    same (the others in `merged`)."""

    id: str
    category: str
    name: str = ""
    text: str
    by: str
    at: int
    authority: int = BACKGROUND
    support: int = 1
    merged: tuple[str, ...] = ()


class Summary(msgspec.Struct, frozen=True, kw_only=True):
    """What `summarize` drew from the memory (a SelfModel without its stamps)."""

    entries: tuple[SelfModelEntry, ...] = ()
    total: int = 0
    merged: int = 0
    dropped: int = 0
    unverified_imports: int = 0
    authority_claims: int = 0
    contradictions: tuple[str, ...] = ()


class SelfModel(Summary, frozen=True, kw_only=True):
    """Payload of self-model-refreshed: the seq and time it was built at, the cycle, the self
    identity, at most `self_model.max_entries` entries (the highest authority first, then
    support, then the newest), how many there were in all after merging, and what the
    refresh merged, dropped, kept out (imports no person verified; authority claims: state
    filed under AUTHORITY_CATEGORIES, since authority comes from grants) and found
    contradictory
    ("<identity>/<slot>" of a contested belief, "<identity>/<category>:<name>" of a name
    holding different texts)."""

    basis_seq: int
    refreshed_at: int
    cycle: str
    identity: str


register_kind(SELF_MODEL, "the maintenance cycle rebuilt the self-model summary; key: "
              f"{SELF_MODEL_KEY}", SelfModel)


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else msgspec.json.encode(value).decode()


def _norm(text: str) -> str:
    return " ".join(text.casefold().split()).strip(" .!;,")


def _entries(memory: IdentityMemory, now: int) -> list[tuple[SelfModelEntry, bool]]:
    """Every record of the self identity's memory as an entry, and whether it still holds
    (a fact whose valid_until has passed was superseded)."""
    identity = memory.identity
    found: list[tuple[SelfModelEntry, bool]] = []
    for name, item in memory.state.items():
        category, _, label = name.partition(":")
        found.append((SelfModelEntry(
            id=element_id(identity, name), category=category if label else "state",
            name=label or name, text=_as_text(item.value), by=item.by, at=item.updated_at),
            True))
    for note in memory.facts.values():
        found.append((SelfModelEntry(id=element_id(identity, note.record), category="fact",
                                     text=note.text, by="", at=note.ts),
                      note.valid_until is None or note.valid_until > now))
    if memory.reflection is not None:
        note = memory.reflection
        found.append((SelfModelEntry(id=element_id(identity, note.record),
                                     category="reflection", text=note.text, by="", at=note.ts),
                      True))
    return found


def summarize(memory: IdentityMemory, elements: ElementsState, *, now: int,
              opened: Callable[[str], str], max_entries: int,
              import_origins: Sequence[str] = (), verified: Collection[str] = (),
              contested: Sequence[str] = ()) -> Summary:
    """The self-model of `memory` (the self identity's), deterministic: live entries only
    (dropped: archived, tombstoned, retracted, corrected, a fact past its valid_until),
    imports (a writer of `import_origins`) kept out unless a person `verified` them, and
    then at BACKGROUND authority; claims to authority (AUTHORITY_CATEGORIES) left out;
    duplicates merged (one category, name and opened text, case and spacing aside: the
    highest authority's, then the newest, is kept); contradictions noted (`contested`
    slots of this identity, a name holding different texts); at most `max_entries` kept."""
    dropped = outside = claims = 0
    live: list[tuple[SelfModelEntry, str]] = []
    for found, holds in _entries(memory, now):
        if found.category.casefold() in AUTHORITY_CATEGORIES:
            claims += 1
            continue
        element = elements.elements.get(found.id)
        if not holds or element is None or element.stage != "active" or element.retracted \
                or element.corrected_by is not None:
            dropped += 1
            continue
        by = found.by or element.writer
        outside_in = imported(by, import_origins)
        if outside_in and found.id not in verified:
            outside += 1
            continue
        entry = msgspec.structs.replace(found, by=by,
                                        authority=BACKGROUND if outside_in else rank(by))
        live.append((entry, _norm(opened(entry.text))))
    groups: dict[tuple[str, str, str], list[SelfModelEntry]] = defaultdict(list)
    texts: dict[tuple[str, str], set[str]] = defaultdict(set)
    for entry, text in live:
        groups[(entry.category, _norm(entry.name), text)].append(entry)
        if entry.name:
            texts[(entry.category, _norm(entry.name))].add(text)
    merged: list[SelfModelEntry] = []
    for same in groups.values():
        same.sort(key=lambda e: (-e.authority, -e.at, e.id))
        merged.append(msgspec.structs.replace(
            same[0], support=len(same), merged=tuple(sorted(e.id for e in same[1:]))))
    merged.sort(key=lambda e: (-e.authority, -e.support, -e.at, e.id))
    prefix = f"{memory.identity}/"
    contradictions = sorted({c for c in contested if c.startswith(prefix)} | {
        f"{prefix}{category}:{name}" for (category, name), said in texts.items()
        if len(said) > 1})
    return Summary(entries=tuple(merged[:max_entries]), total=len(merged),
                   merged=len(live) - len(merged), dropped=dropped, unverified_imports=outside,
                   authority_claims=claims, contradictions=tuple(contradictions))


def _opener(keys: ElementKeys | None) -> Callable[[str], str]:
    def opened(text: str) -> str:
        try:
            return _as_text(reveal(text, keys, purged="(purged)"))
        except ElementTextUnreadable:
            return text  # compared as stored: it merges with nothing else
    return opened


async def self_model(run: CycleRun) -> None:
    """11. SelfModel refresh: the summary of the self identity's memory, recorded as a
    self-model-refreshed event when it differs from the last one (and never while the self
    identity holds nothing)."""
    settings = run.settings.self_model
    if not await run.allowed("maintain", "refresh the self-model"):
        return
    if not run.budget.allows(writes=2, transactions=1):
        run.deferred.append("self-model: not refreshed (budget)")
        return
    memory = await _memory_of(run.store, settings.identity)
    last = await latest_self_model(run.store)
    if memory is None and last is None:
        return
    elements = await run.reader.current()
    reviews = await run.fold(ImportReviews())
    found = await asyncio.to_thread(
        summarize, memory or IdentityMemory(identity=settings.identity), elements,
        now=run.cycle_start, opened=_opener(run.store.keys), max_entries=settings.max_entries,
        import_origins=run.settings.imports.origins,
        verified={eid for eid, status in reviews.items() if status == "verified"},
        contested=run.contested)
    if last is not None and _drew_on(last) == _drew_on(found) \
            and last.identity == settings.identity:
        return  # unchanged: the last summary still holds
    body = SelfModel(basis_seq=await run.store.last_seq(), refreshed_at=run.cycle_start,
                     cycle=run.cycle, identity=settings.identity, **msgspec.structs.asdict(found))
    refresh = f"self-model:{run.cycle}:{body.basis_seq}"
    drew_on = tuple(sorted({i for e in body.entries for i in (e.id, *e.merged)}))
    activity = activity_draft(refresh, ActivityBody(
        activity_class=REFRESH_CLASS, actors=(PRINCIPAL,), inputs=drew_on,
        outputs=(SELF_MODEL_KEY,), started_at=run.now, ended_at=run.now), origin=ORIGIN,
        cause=run.cause)
    await run.append([
        EventDraft(SELF_MODEL, SELF_MODEL_KEY, msgspec.to_builtins(body), origin=ORIGIN,
                   cause=run.cause, idem=f"maintenance:{refresh}"),
        msgspec.structs.replace(activity, idem=f"maintenance:{refresh}:activity")])


async def _memory_of(store: EventStore, identity: str) -> IdentityMemory | None:
    """The current memory of one identity, folded from its own events only (the whole
    memory's fold would cost a cycle the whole log)."""
    fold = Memory()
    state = fold.initial()
    for event in await store.read(key=identity_key(identity), kinds=fold.kinds):
        state = fold.apply(state, event)
    return state.get(identity)


def _drew_on(body: SelfModel | Summary) -> tuple[object, ...]:
    return (body.entries, body.total, body.merged, body.dropped, body.unverified_imports,
            body.authority_claims, body.contradictions)


async def latest_self_model(store: EventStore) -> SelfModel | None:
    """The newest self-model summary maintenance wrote, or None."""
    for event in await store.read(kinds=[SELF_MODEL], key=SELF_MODEL_KEY, limit=20,
                                  newest_first=True):
        if event.origin == ORIGIN:
            return event.payload(SelfModel)
    return None


def render(body: SelfModel, keys: ElementKeys | None) -> str:
    """The summary as text, grouped by category, sealed texts opened with `keys` (a purged
    one reads "(purged)"), each entry cut to ENTRY_CHARS and the whole to MAX_RENDER."""
    opened = _opener(keys)
    by_category: dict[str, list[str]] = defaultdict(list)
    for e in body.entries:
        text = opened(e.text)
        line = f"{e.name}: {text}" if e.name else text
        seen = f" (said {e.support} times)" if e.support > 1 else ""
        by_category[e.category].append(f"- {line[:ENTRY_CHARS]}{seen} [{e.by}]")
    lines = [f"{category}:\n" + "\n".join(items) for category, items in by_category.items()]
    if body.total > len(body.entries):
        lines.append(f"... and {body.total - len(body.entries)} more")
    if body.contradictions:
        lines.append("Contradictions (unresolved): " + ", ".join(body.contradictions))
    return ("\n".join(lines) or NOTHING_KNOWN)[:MAX_RENDER]


async def self_model_summary(store: EventStore) -> str | None:
    """The latest self-model summary as text, introduced by the seq and time it was built at
    (so a stale one says so); None before a cycle has refreshed it."""
    body = await latest_self_model(store)
    if body is None:
        return None
    at = datetime.datetime.fromtimestamp(body.refreshed_at / 1000, datetime.UTC)
    return (f"Self-model of {body.identity!r} as of event #{body.basis_seq} "
            f"({at.strftime('%Y-%m-%d %H:%M UTC')}):\n"
            f"{await asyncio.to_thread(render, body, store.keys)}")
