"""`upulse effects cancel|retry ID`: an operator's say over one effect.

Each appends one event to the home's log through pulse_core.cancel_effect / retry_effect,
expecting the effect's current version, so it works while the daemon runs (SQLite's WAL lets a
second process write) and a race with the daemon's claim is decided by the store.
"""

from __future__ import annotations

from pulse_cli.home import Home
from pulse_cli.output import print_json, printable
from pulse_cli.stores import opened
from pulse_core import Event, cancel_effect, retry_effect

ORIGIN = "cli"
"""Who the events name: their origin is `human:cli`."""


async def cancel(home: Home, *, effect_id: str, reason: str, as_json: bool) -> int:
    """Cancel pending or retrying effect `effect_id`: no executor loop runs it."""
    event = await _append(home, "cancel", effect_id, reason)
    _report(event, as_json, f"effect {effect_id} cancelled (it was {event.data['was']}; event "
                            f"#{event.seq}) — no executor loop will run it")
    return 0


async def retry(home: Home, *, effect_id: str, reason: str, as_json: bool) -> int:
    """Make effect `effect_id`, which failed for good or was cancelled, pending again."""
    event = await _append(home, "retry", effect_id, reason)
    _report(event, as_json, f"effect {effect_id} is pending again (it was "
                            f"{event.data['was']}; event #{event.seq}) — the daemon's executor "
                            "loop runs it, with its max attempts counted afresh")
    return 0


async def _append(home: Home, action: str, effect_id: str, reason: str) -> Event:
    control = cancel_effect if action == "cancel" else retry_effect
    async with opened(home, read_only=False) as stores:
        return await control(stores.events, effect_id, reason=reason, origin=ORIGIN)


def _report(event: Event, as_json: bool, line: str) -> None:
    if as_json:
        print_json(event)
    else:
        print(printable(line))
