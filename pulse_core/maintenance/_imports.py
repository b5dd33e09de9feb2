"""Imported cognition: memory that came from outside, and a person's word that checked it.

An element is imported when its writer's origin is one of the import origins, or under one
(`agent:import`, `agent:peer:<agent>`, `agent:tool:<name>`, `agent:web:<site>` by default).
Imported authority does not transfer (seed 004): until a person verifies an import
(`verify_import`, honoured only from a human origin) it ranks as a background writer's, below
the agent's own word; once verified it ranks as its writer's, never higher. The maintenance
layer's review (pulse_adapters.maintenance) flags the unverified ones for a person.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import msgspec

from pulse_core._errors import NotAuthorized
from pulse_core._events import Event, EventDraft, register_kind
from pulse_core._pmap import PersistentMap
from pulse_core._snapshot import Projection
from pulse_core.maintenance._authority import BACKGROUND, HUMAN, rank
from pulse_core.store import EventStore

IMPORT_ORIGINS = ("agent:import", "agent:peer", "agent:tool", "agent:web")
"""Writers whose memory came from outside: an importer, another agent, a tool's output, the
web (an origin is `agent...` for all of them: the agent's channels write them)."""

IMPORT_VERIFIED = "import-verified"


class ImportVerified(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of import-verified: the element a person checked, and what they found."""

    element: str
    reason: str = ""


register_kind(IMPORT_VERIFIED, "a person verified imported cognition (honoured only from a human "
              "origin); key: import-review:<element id>", ImportVerified)


def import_review_key(element: str) -> str:
    """The event key of one element's import review."""
    return f"import-review:{element}"


def imported(origin: str, origins: Iterable[str] = IMPORT_ORIGINS) -> bool:
    """Whether a writer `origin` is one of the import `origins`: equal to one, or one
    followed by ':' or '-' (`agent:import` covers `agent:import:wiki`)."""
    origins = tuple(origins)
    return origin in origins or origin.startswith(_under(origins))


@functools.lru_cache(maxsize=16)
def _under(origins: tuple[str, ...]) -> tuple[str, ...]:
    """How an origin under one of `origins` begins."""
    return tuple(o + sep for o in origins for sep in ":-")


def import_rank(writer: str, verified: bool, origins: Iterable[str] = IMPORT_ORIGINS) -> int:
    """The rank of what `writer` wrote: its own (`rank`), but BACKGROUND for an import no
    person has `verified`."""
    if not verified and imported(writer, origins):
        return BACKGROUND
    return rank(writer)


class VerifiedImports(Projection[PersistentMap[str, bool]]):
    """The elements a person verified (an import-verified event from a human origin, filed
    under the element's review key); once verified an element stays verified."""

    name = "verified-imports"
    kinds = frozenset({IMPORT_VERIFIED})

    def initial(self) -> PersistentMap[str, bool]:
        return PersistentMap()

    def apply(self, state: PersistentMap[str, bool], event: Event) -> PersistentMap[str, bool]:
        element = event.data.get("element") if isinstance(event.data, dict) else None
        if (not isinstance(element, str) or event.key != import_review_key(element)
                or rank(event.origin) != HUMAN or element in state):
            return state
        return state.set(element, True)


async def verify_import(store: EventStore, element: str, *, origin: str,
                        reason: str = "") -> Event:
    """The gate: a person records that imported element `element` was checked. It lifts the
    maintenance review's flag, lets the element into the self-model, and recall ranks it as
    its writer's from then on (never above). NotAuthorized (nothing written) for an origin
    that is not a person's."""
    if rank(origin) != HUMAN:
        raise NotAuthorized(origin, "elevate_authority", (
            f"{origin} may not verify imported element {element!r}: only a person does "
            "(origin human or human:<who>), through upulse, the web UI or a program holding "
            "a person's store handle"))
    (event,) = (await store.append([EventDraft(
        IMPORT_VERIFIED, import_review_key(element), msgspec.to_builtins(ImportVerified(
            element=element, reason=reason)), origin=origin)])).events
    return event
