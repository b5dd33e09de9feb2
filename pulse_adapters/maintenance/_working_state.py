"""Seed 004's WorkingState refresh (cycle step 12) and the session primer read from it.

The working state is a derived digest of open commitments, armed watches and contested
slots, stamped with the seq it was built at: a view served with its basis, never evidence."""

from __future__ import annotations

import datetime

import msgspec

from pulse_adapters.maintenance._context import CycleRun
from pulse_adapters.maintenance._settings import ORIGIN
from pulse_core import EventDraft, EventStore, register_kind
from pulse_core.maintenance import Watches

WORKING_STATE = "working-state-refreshed"
WORKING_STATE_KEY = "working-state:self"
MAX_ITEMS = 10  # commitments, watches and contested slots each list at most this many
MAX_SUMMARY = 2_000  # characters of a digest
PRIMER_CHARS = 1_200  # a session primer's default size
NOTHING_OPEN = "Nothing open: no commitments, armed watches or contested slots."


class WorkingState(msgspec.Struct, frozen=True, kw_only=True):
    """Payload of working-state-refreshed: the digest (`summary`, at most MAX_SUMMARY
    characters), the seq and time it was built at, the cycle that built it, and the ids it
    drew on (open commitments, armed watches; at most MAX_ITEMS each)."""

    summary: str
    basis_seq: int
    refreshed_at: int
    cycle: str
    commitments: tuple[str, ...] = ()
    watches: tuple[str, ...] = ()


register_kind(WORKING_STATE, "the maintenance cycle rebuilt the working-state digest; key: "
              f"{WORKING_STATE_KEY}", WorkingState)


def _when(ms: int | None) -> str:
    if ms is None:
        return "no due time"
    at = datetime.datetime.fromtimestamp(ms / 1000, datetime.UTC)
    return "due " + at.strftime("%Y-%m-%d %H:%M UTC")


def _section(title: str, items: list[str]) -> list[str]:
    if not items:
        return []
    more = [f"- ... and {len(items) - MAX_ITEMS} more"] if len(items) > MAX_ITEMS else []
    return [f"{title} ({len(items)}):", *items[:MAX_ITEMS], *more]


async def working_state(run: CycleRun) -> None:
    """12. WorkingState refresh: the digest of open commitments (soonest due first), armed
    watches and contested slots, recorded as a working-state-refreshed event when it differs
    from the last one (and not at all while nothing was ever open)."""
    if not await run.allowed("maintain", "refresh the working state"):
        return
    if not run.budget.allows(writes=1, transactions=1):
        run.deferred.append("working state: not refreshed (budget)")
        return
    state = await run.reader.current()
    basis = await run.store.last_seq()
    late = {e.id for e in (await run.census()).overdue}
    open_ = sorted((e for e in state.elements.values() if e.commitment is not None
                    and e.commitment.status in ("pending", "blocked") and e.stage == "active"),
                   key=lambda e: (e.commitment.due_at if e.commitment else None) or 2**62)
    commitments = [
        f"- {e.commitment.text} ({_when(e.commitment.due_at)}, {e.commitment.status}"
        + (", overdue)" if e.id in late else ")") for e in open_ if e.commitment is not None]
    armed = sorted((w for w in (await run.fold(Watches())).values() if w.status == "armed"),
                   key=lambda w: w.armed_seq)
    watches = [f"- {w.id}: {w.spec.reason or w.spec.watch_class}" for w in armed]
    lines = [*_section("Open commitments", commitments), *_section("Armed watches", watches),
             *_section("Contested slots", [f"- {c}" for c in run.contested])]
    summary = ("\n".join(lines) or NOTHING_OPEN)[:MAX_SUMMARY]
    last = await _latest(run.store)
    if (last.summary if last is not None else NOTHING_OPEN) == summary:
        return  # unchanged (or nothing open ever): the last digest still holds
    body = WorkingState(summary=summary, basis_seq=basis,
                        refreshed_at=run.cycle_start, cycle=run.cycle,
                        commitments=tuple(e.id for e in open_[:MAX_ITEMS]),
                        watches=tuple(w.id for w in armed[:MAX_ITEMS]))
    await run.append([EventDraft(WORKING_STATE, WORKING_STATE_KEY, msgspec.to_builtins(body),
                                 origin=ORIGIN, cause=run.cause,
                                 idem=f"maintenance:working-state:{run.cycle}")])
    run.changes["working_state_refreshed"] += 1


async def _latest(store: EventStore) -> WorkingState | None:
    found = await store.read(kinds=[WORKING_STATE], key=WORKING_STATE_KEY, limit=1,
                             newest_first=True)
    return found[0].payload(WorkingState) if found else None


async def session_primer(store: EventStore, *, max_chars: int = PRIMER_CHARS) -> str | None:
    """The session primer: the latest working-state digest, introduced by the seq and time
    it was built at (so a stale one says so), cut to `max_chars` (at least 80); None when no
    cycle has refreshed the working state yet. ValueError for a smaller `max_chars`."""
    if max_chars < 80:
        raise ValueError(f"max_chars {max_chars} is below 80: a primer that short says nothing")
    body = await _latest(store)
    if body is None:
        return None
    at = datetime.datetime.fromtimestamp(body.refreshed_at / 1000, datetime.UTC)
    text = (f"Working state as of event #{body.basis_seq} "
            f"({at.strftime('%Y-%m-%d %H:%M UTC')}):\n{body.summary}")
    return text if len(text) <= max_chars else text[:max_chars - 4] + " ..."
