"""The reviewer's settings, with the floors the seed insists on."""

from __future__ import annotations

from typing import ClassVar

import msgspec

from pulse_core import PulseError

INTERVAL_FLOOR_S = 30.0


class AwarenessConfigError(PulseError):
    """An awareness setting is outside what the reviewer can run with; `field` names it."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"awareness.{field} {problem}")


class EvidenceCaps(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How many items of each kind the evidence may show (the rest are counted, not shown)."""

    exchanges: int = 12
    state: int = 20
    unresolved: int = 10
    observations: int = 20
    facts: int = 10


class AwarenessConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Cadence, quiet time, evidence bounds, gate bounds, degradation and budgets.

    Foreground: reviews on the fallback route always yield to the agent's foreground work;
    `shared_route` says the reviewer's model route is the agent's own whatever its health,
    so reviews on the healthy route yield too. A yielding review waits at most
    `foreground_wait_s` for the foreground to be free (then it is recorded as preempted),
    and a hold its holder never ends lapses after `foreground_lapse_s` by default.
    """

    interval_s: float = 60.0
    fallback_interval_s: float = 300.0
    initial_delay_s: float = 30.0
    quiet_ceiling_s: float = 3600.0
    quiet_hold_s: float = 300.0
    backoff_base_s: float = 60.0
    backoff_max_s: float = 3600.0
    route_stale_s: float = 180.0
    renamed_fields: ClassVar[dict[str, str]] = {
        "route_key": "`route_key`, beside base_url and model, not under review"}
    max_reviews_per_tick: int = 4
    verb_budget: int = 4
    confidence_step: float = 0.2
    narration_chars: int = 600
    field_chars: int = 400
    envelope_chars: int = 16_000
    caps: EvidenceCaps = EvidenceCaps()
    degrade_window: int = 10
    degrade_above: float = 0.5
    recover_below: float = 0.2
    calls_per_identity_per_day: int = 48
    calls_per_day: int = 5_000
    max_tokens: int = 700
    shared_route: bool = False
    foreground_wait_s: float = 120.0
    foreground_lapse_s: float = 600.0

    def __post_init__(self) -> None:
        for name in ("fallback_interval_s", "initial_delay_s", "quiet_ceiling_s",
                     "backoff_base_s", "backoff_max_s", "route_stale_s", "foreground_wait_s",
                     "foreground_lapse_s"):
            if getattr(self, name) <= 0:
                raise AwarenessConfigError(name, "must be > 0")
        if not 1 <= self.verb_budget <= 16:
            raise AwarenessConfigError("verb_budget", "must be within 1..16")
        if not 0 < self.confidence_step <= 1:
            raise AwarenessConfigError("confidence_step", "must be within (0, 1]")
        if not 0 <= self.recover_below <= self.degrade_above <= 1:
            raise AwarenessConfigError(
                "recover_below", "must be within 0..degrade_above, and degrade_above within "
                "recover_below..1")

    @property
    def healthy_interval_s(self) -> float:
        """The fast cadence, never below the 30 s floor whatever the config says."""
        return max(INTERVAL_FLOOR_S, self.interval_s)
