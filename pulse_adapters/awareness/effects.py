"""The effect the awareness rule emits for its executor."""

from __future__ import annotations

from typing import ClassVar

from pulse_core import Effect


class AwarenessReview(Effect, tag="awareness-review"):
    """Review one identity: its world changed (`reason="changed"`) or the quiet ceiling came
    (`reason="ceiling"`), after `quiet_skips` unchanged checks. Any engine sharing the log
    may run it: the identity's memory is in the log, not on a host."""

    any_host: ClassVar[bool] = True

    identity: str
    fingerprint: str
    source: str
    reason: str
    route: str
    quiet_skips: int = 0
    narration_only: bool = False

    def dedup_key(self) -> str:
        return f"awareness-review:{self.identity}"
