"""The event an operator's request about one essential process is (see pulse_survival.control)."""

from __future__ import annotations

from typing import Literal

import msgspec

from pulse_core import register_kind

PROCESS_REQUESTED = "process-requested"
"""The kind of an operator's request about one essential process."""
Action = Literal["start", "stop", "restart", "reset"]
"""What an operator may ask of an essential process."""
ACTIONS: tuple[Action, ...] = ("start", "stop", "restart", "reset")


class ProcessRequest(msgspec.Struct, frozen=True):
    """The data of `process-requested`: `action` asked of essential process `name`, why, and
    the host whose survival layer is to act (where engines of several hosts share a log)."""

    action: Action
    name: str
    reason: str = ""
    host: str = ""


register_kind(PROCESS_REQUESTED, "an operator asked the survival layer to start, stop, "
                                 "restart or reset (FATAL) an essential process; key: "
                                 "process:<name>; data: action, name, reason, host; origin: "
                                 "who asked (human:cli, human:web)", ProcessRequest)
