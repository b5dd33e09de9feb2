"""Seed 004's WorkingState refresh (cycle step 12) and the session primer read from it.

The working state is a derived digest of open commitments, armed watches and contested
slots, stamped with the seq it was built at: a view served with its basis, never evidence."""

from __future__ import annotations

import asyncio
import datetime

import msgspec

from pulse_adapters.maintenance._context import CycleRun
from pulse_adapters.maintenance._self_model import self_model_summary
from pulse_adapters.maintenance._settings import ORIGIN
from pulse_core import EventDraft, EventStore, register_kind
from pulse_core.maintenance import Watches
from pulse_core.store import ElementKeys, reveal

WORKING_STATE = "working-state-refreshed"
WORKING_STATE_KEY = "working-state:self"
MAX_ITEMS = 10  # commitments, watches and contested slots each list at most this many
MAX_SUMMARY = 2_000  # characters of a rendered digest
PRIMER_CHARS = 1_200  # a session primer's default size
NOTHING_OPEN = "Nothing open: no commitments, armed watches or contested slots."


class OpenCommitment(msgspec.Struct, frozen=True, kw_only=True):
    """A commitment in the digest: its element id, its text as stored (sealed in a home, so
    a purged commitment's text stays unreadable here too), due time, status, and whether it
    is overdue."""

    id: str
    text: str
    due_at: int | None = None
    status: str = "pending"
    overdue: bool = False


class WorkingState(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of working-state-refreshed: the seq and time the digest was built at, the
    cycle that built it, and what it drew on: open commitments (soonest due first), armed
    watches ("<id>: <reason>") and contested slots, at most MAX_ITEMS of each, with how many
    there were in all."""

    basis_seq: int
    refreshed_at: int
    cycle: str
    commitments: tuple[OpenCommitment, ...] = ()
    open_commitments: int = 0
    watches: tuple[str, ...] = ()
    armed_watches: int = 0
    contested: tuple[str, ...] = ()
    contested_slots: int = 0


register_kind(WORKING_STATE, "the maintenance cycle rebuilt the working-state digest; key: "
              f"{WORKING_STATE_KEY}", WorkingState)


def _when(ms: int | None) -> str:
    if ms is None:
        return "no due time"
    at = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return "due " + at.strftime("%Y-%m-%d %H:%M UTC")


def _section(title: str, items: list[str], total: int) -> list[str]:
    if not total:
        return []
    more = [f"- ... and {total - len(items)} more"] if total > len(items) else []
    return [f"{title} ({total}):", *items, *more]


def render(body: WorkingState, keys: ElementKeys | None) -> str:
    """The digest as text, its sealed commitment texts opened with `keys` (a purged one
    reads as "(purged)"), at most MAX_SUMMARY characters."""
    commitments = [
        f"- {reveal(c.text, keys, purged='(purged)')} ({_when(c.due_at)}, {c.status}"
        + (", overdue)" if c.overdue else ")") for c in body.commitments]
    lines = [*_section("Open commitments", commitments, body.open_commitments),
             *_section("Armed watches", [f"- {w}" for w in body.watches], body.armed_watches),
             *_section("Contested slots", [f"- {c}" for c in body.contested],
                       body.contested_slots)]
    return ("\n".join(lines) or NOTHING_OPEN)[:MAX_SUMMARY]


async def working_state(run: CycleRun) -> None:
    """12. WorkingState refresh: the digest of open commitments (soonest due first), armed
    watches and contested slots, recorded as a working-state-refreshed event when it differs
    from the last one (and not at all while nothing was ever open)."""
    if not await run.allowed("maintain", "refresh the working state"):
        return
    if not run.budget.allows(writes=1, transactions=1):
        run.deferred.append("working state: not refreshed (budget)")
        return
    found = await run.census()
    late = {e.id for e in found.overdue}
    open_ = sorted((e for e in found.commitments if e.stage == "active"),
                   key=lambda e: ((e.commitment.due_at if e.commitment else None) or 2**62,
                                  e.id))
    armed = sorted((w for w in (await run.fold(Watches())).values() if w.status == "armed"),
                   key=lambda w: w.armed_seq)
    body = WorkingState(
        basis_seq=await run.store.last_seq(), refreshed_at=run.cycle_start, cycle=run.cycle,
        commitments=tuple(OpenCommitment(id=e.id, text=e.commitment.text,
                                         due_at=e.commitment.due_at, status=e.commitment.status,
                                         overdue=e.id in late)
                          for e in open_[:MAX_ITEMS] if e.commitment is not None),
        open_commitments=len(open_),
        watches=tuple(f"{w.id}: {w.spec.reason or w.spec.watch_class}"[:200]
                      for w in armed[:MAX_ITEMS]),
        armed_watches=len(armed),
        contested=tuple(run.contested[:MAX_ITEMS]), contested_slots=len(run.contested))
    last = await _latest(run.store)
    if _drew_on(body) == (_drew_on(last) if last is not None else _drew_on(None)):
        return  # unchanged (or nothing open ever): the last digest still holds
    await run.append([EventDraft(WORKING_STATE, WORKING_STATE_KEY, msgspec.to_builtins(body),
                                 origin=ORIGIN, cause=run.cause,
                                 idem=f"maintenance:working-state:{run.cycle}")])
    run.changes["working_state_refreshed"] += 1


def _drew_on(body: WorkingState | None) -> tuple[object, ...]:
    if body is None:
        return ((), 0, (), 0, (), 0)
    return (body.commitments, body.open_commitments, body.watches, body.armed_watches,
            body.contested, body.contested_slots)


async def _latest(store: EventStore) -> WorkingState | None:
    found = await store.read(kinds=[WORKING_STATE], key=WORKING_STATE_KEY, limit=1,
                             newest_first=True)
    return found[0].payload(WorkingState) if found else None


async def session_primer(store: EventStore, *, max_chars: int = PRIMER_CHARS) -> str | None:
    """The session primer: the latest working-state digest, then the latest self-model
    summary, each introduced by the seq and time it was built at (so a stale one says so),
    their sealed texts opened with the store's keys, the whole cut to `max_chars` (at least
    80); None when no cycle has refreshed either yet. ValueError for a smaller
    `max_chars`."""
    if max_chars < 80:
        raise ValueError(f"max_chars {max_chars} is below 80: a primer that short says nothing")
    parts: list[str] = []
    body = await _latest(store)
    if body is not None:
        at = datetime.datetime.fromtimestamp(body.refreshed_at / 1000, datetime.UTC)
        parts.append(f"Working state as of event #{body.basis_seq} "
                     f"({at.strftime('%Y-%m-%d %H:%M UTC')}):\n"
                     f"{await asyncio.to_thread(render, body, store.keys)}")
    self_model = await self_model_summary(store)
    if self_model is not None:
        parts.append(self_model)
    if not parts:
        return None
    text = "\n\n".join(parts)
    return text if len(text) <= max_chars else text[:max_chars - 4] + " ..."
