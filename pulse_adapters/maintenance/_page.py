"""The maintenance layer's page in the web UI: the cycles it ran and what the last one
reported.

MaintenanceCycles folds, in the UI's process, each cycle as it began
(`maintenance-cycle-began`) and ended (its activity's `activity-completed`, `-failed` or
`-cancelled`, whose `report` is the cycle's CycleReport), and the newest request for a cycle.
"""

from __future__ import annotations

from typing import Any

import msgspec

from pulse_adapters.maintenance._ledger import CYCLES_KEY, ENDINGS, CycleBegan, CycleRequested
from pulse_adapters.maintenance._settings import ORIGIN
from pulse_core import Event, PageRequest, Projection, UiPage

CYCLES_KEPT = 50
"""The newest cycles the page lists."""


class CycleRow(msgspec.Struct, frozen=True, kw_only=True):
    """One cycle as the page lists it; `report` is its CycleReport, once it ended."""

    cycle: str
    trigger: str
    began_at: int
    status: str = "running"
    ended_at: int | None = None
    reason: str = ""
    report: dict[str, Any] | None = None


class CyclesData(msgspec.Struct, frozen=True):
    """The newest cycles, oldest first, how many began in all, and the newest request."""

    cycles: tuple[CycleRow, ...] = ()
    began: int = 0
    requested_at: int | None = None
    request_reason: str = ""


class MaintenanceCycles(Projection[CyclesData]):
    """The cycles the maintenance page shows (see the module's docstring)."""

    name = "maintenance-page"
    kinds = frozenset({"maintenance-cycle-began", "maintenance-requested", *ENDINGS})

    def initial(self) -> CyclesData:
        return CyclesData()

    def apply(self, state: CyclesData, event: Event) -> CyclesData:
        replace = msgspec.structs.replace
        if event.kind == "maintenance-requested":
            return replace(state, requested_at=event.ts,
                           request_reason=event.payload(CycleRequested).reason)
        if event.kind == "maintenance-cycle-began":
            if event.key != CYCLES_KEY or event.origin != ORIGIN:
                return state  # the maintenance ledger ignores it too
            began = event.payload(CycleBegan)
            row = CycleRow(cycle=began.cycle, trigger=began.trigger, began_at=event.ts)
            return replace(state, cycles=(*state.cycles, row)[-CYCLES_KEPT:],
                           began=state.began + 1)
        cycle = event.key.removeprefix("activity:")
        data = event.data if isinstance(event.data, dict) else {}
        report = data.get("report")
        rows = tuple(replace(row, status=event.kind.removeprefix("activity-"),
                             ended_at=event.ts, reason=str(data.get("reason", "")),
                             report=report if isinstance(report, dict) else None)
                     if row.cycle == cycle else row for row in state.cycles)
        return replace(state, cycles=rows)


def _row_json(row: CycleRow) -> dict[str, Any]:
    report = row.report or {}
    health = report.get("health") or ()
    return {"cycle": row.cycle, "trigger": row.trigger, "began_at": row.began_at,
            "status": row.status, "ended_at": row.ended_at,
            "took_ms": None if row.ended_at is None else row.ended_at - row.began_at,
            "outcome": report.get("outcome") or row.reason or None,
            "reviewed": report.get("reviewed"), "writes": report.get("writes"),
            "changes": report.get("changes"), "warnings": len(report.get("warnings") or ()),
            "healthy": all(s.get("healthy", True) for s in health) if health else None}


def cycle_history(state: CyclesData) -> list[dict[str, Any]]:
    """The cycles of `state`, newest first, as the page lists them, each with its `report`
    whole (None while it runs, or when it ended without one)."""
    return [{**_row_json(row), "report": row.report} for row in reversed(state.cycles)]


async def maintenance(request: PageRequest) -> dict[str, Any]:
    """What the Maintenance page shows: the cycles, newest first, and the newest report."""
    state = request.snapshot.state(MaintenanceCycles)
    ended = [row for row in state.cycles if row.report is not None]
    last = ended[-1].report if ended else None
    return {
        "cycles_began": state.began,
        "running": sum(1 for row in state.cycles if row.status == "running"),
        "last_request": state.request_reason or None,
        "cycles": [_row_json(row) for row in reversed(state.cycles)],
        "last_report": None if last is None else {
            "cycle": last.get("cycle"), "outcome": last.get("outcome"),
            "health": list(last.get("health") or ()), "deferred": last.get("deferred"),
            "needed_authority": last.get("needed_authority"),
            "warnings": last.get("warnings")},
    }


def maintenance_page() -> UiPage:
    """The Maintenance page (drawn by the UI's generic page)."""
    return UiPage("maintenance", "Maintenance", maintenance, projections=(MaintenanceCycles(),))
