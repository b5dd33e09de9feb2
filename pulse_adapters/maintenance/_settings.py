"""The maintenance layer's settings: when a cycle runs, how much one cycle may do, how memory
decays, what retention archives, what the maintenance principal is granted, and who proposes
consolidations.

In config.json they are the object under `"layers": {"maintenance": {...}}` (every field has a
default, so `{}` switches the layer on); in Python a `MaintenanceSettings(...)`. A wrong value
raises MaintenanceSettingsError naming the field (`decay.factor`, `schedule.daily_at`, ...).
"""

from __future__ import annotations

import re
import zoneinfo
from typing import Any

import msgspec

from pulse_adapters.llm import ModelEndpoint
from pulse_core import LayerError, layer_settings
from pulse_core.maintenance import IMPORT_ORIGINS, PERMISSIONS

LAYER = "maintenance"
"""The layer's name, in config.json and in the `pulse.layers` entry-point group."""

PRINCIPAL = "maintenance"
"""The principal maintenance acts as; its writes carry origin `executor:maintenance`."""

ORIGIN = "executor:maintenance"

DEFAULT_GRANTS = ("read", "search", "maintain", "archive")

MAX_GAP_S = 7 * 86_400
"""`triggers.min_gap_s` at most 7 days."""
MAX_TIMEOUT_S = 86_400
"""`timeout_s` (one cycle attempt) at most 24 hours."""
MAX_MODEL_S = 3_600
"""`consolidation.timeout_s` and `consolidation.max_wall_s` at most an hour."""
MAX_COUNT = 1_000_000
"""`triggers.backlog` and `triggers.post_session_exchanges` at most a million."""
MAX_ARCHIVE_DAYS = 36_500
"""`retention.archive_after_days` at most 100 years."""

MAX_SELF_MODEL_ENTRIES = 200
"""`self_model.max_entries` at most 200."""
DEFAULT_IMPORT_ORIGINS = IMPORT_ORIGINS
"""Writers whose memory came from outside (pulse_core.maintenance.IMPORT_ORIGINS, the ones
recall ranks below the agent's own word until a person verifies them)."""

_DAILY = re.compile(r"^(?P<h>[01]\d|2[0-3]):(?P<m>[0-5]\d)$")


class MaintenanceSettingsError(LayerError, ValueError):
    """A setting of the maintenance layer is missing or wrong; the message names the field."""


def _bad(field: str, problem: str) -> MaintenanceSettingsError:
    return MaintenanceSettingsError(f"`{field}` {problem}")


class ScheduleSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """When a scheduled cycle is due: every `every_h` = [low, high] hours after the last one
    (the point within the span is drawn per cycle, deterministically from its id, so engines
    and restarts agree), or, when `daily_at` ("03:00") is set, once a day at that time in
    `tz`. Both null: no scheduled cycles (triggers only)."""

    every_h: tuple[float, float] | None = (12.0, 24.0)
    daily_at: str | None = None
    tz: str = "UTC"

    def __post_init__(self) -> None:
        if self.every_h is not None:
            low, high = self.every_h
            if not 0 < low <= high <= 24 * 30:
                raise _bad("every_h", f"must be [low, high] hours with 0 < low <= high <= 720 "
                                      f"(got {list(self.every_h)!r}), e.g. [12, 24]")
        if self.daily_at is not None and not _DAILY.match(self.daily_at):
            raise _bad("daily_at", f"must be HH:MM on a 24-hour clock (got {self.daily_at!r}), "
                                   "e.g. '03:00'")
        try:
            zoneinfo.ZoneInfo(self.tz)
        except (zoneinfo.ZoneInfoNotFoundError, ValueError):
            raise _bad("tz", f"must name an IANA time zone (got {self.tz!r}), e.g. "
                             "'Europe/Lisbon' or 'UTC'") from None


class Triggers(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What starts a cycle besides the schedule (0 switches a threshold off).

    `post_session_exchanges`: a long session, that many human exchanges on one identity since
    the last cycle; `backlog`: that many sleep tasks the sleep-task step would claim;
    `on_demand`: `request_cycle()` and a requested `MaintenanceCycle` effect; `watches`: a
    change matching an armed delta watch, a watch fired whose review task maintenance would
    claim, or a silence watch past its due time. A threshold trigger (a long session,
    backlog, watches) starts no cycle within `min_gap_s` of the last one began.
    """

    post_session_exchanges: int = 40
    backlog: int = 10
    on_demand: bool = True
    watches: bool = True
    min_gap_s: float = 600.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_gap_s <= MAX_GAP_S:
            raise _bad("min_gap_s", f"must be within 0..{MAX_GAP_S:,} seconds (7 days; got "
                                    f"{self.min_gap_s!r})")
        for name in ("post_session_exchanges", "backlog"):
            if not 0 <= getattr(self, name) <= MAX_COUNT:
                raise _bad(name, f"must be within 0..{MAX_COUNT:,} (0 switches it off; got "
                                 f"{getattr(self, name)})")


class Budgets(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """What one cycle may do in all its steps together: elements looked at, events written,
    appends (transactions). A step that would pass a budget stops there and reports the rest
    as deferred; the next cycle goes on."""

    max_elements_reviewed: int = 5_000
    max_writes: int = 500
    max_transactions: int = 100

    def __post_init__(self) -> None:
        for name, top in (("max_elements_reviewed", 10_000_000), ("max_writes", 1_000_000),
                          ("max_transactions", 100_000)):
            value = getattr(self, name)
            if not 1 <= value <= top:
                raise _bad(name, f"must be within 1..{top:,} (got {value!r})")


class DecaySettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True,
                    kw_only=True):
    """Metabolism: a sweep multiplies memory_strength by `factor`, never below `floor`;
    elements with salience >= `protection` do not decay; `limit` elements per batch (one
    transaction: the bound on how long other writers wait for its commit). A cycle sweeps
    only when the last sweep was `min_interval_h` hours ago or more (0: every cycle), so
    decay follows time, not how often cycles are asked for. Decay never touches
    confidence."""

    factor: float = 0.97
    floor: float = 0.05
    protection: float = 0.8
    limit: int = 10_000
    min_interval_h: float = 12.0

    def __post_init__(self) -> None:
        if not 0 <= self.min_interval_h <= 24 * 30:
            raise _bad("min_interval_h", f"must be within 0..720 hours (got "
                                         f"{self.min_interval_h!r})")
        if not 0 < self.factor < 1:
            raise _bad("factor", f"must be within (0, 1) (got {self.factor!r}), e.g. 0.97")
        if not 0 <= self.floor < 1:
            raise _bad("floor", f"must be within [0, 1) (got {self.floor!r}), e.g. 0.05")
        if not 0 < self.protection <= 1:
            raise _bad("protection", f"must be within (0, 1] (got {self.protection!r})")
        if not 1 <= self.limit <= 100_000:
            raise _bad("limit", f"must be within 1..100,000 elements per batch "
                                f"(got {self.limit!r})")


class RetentionSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Retention review: consolidated exchanges whose strength sits at the decay floor are
    archived `archive_after_days` after they were made (0: never). Purge is never automatic:
    there is no setting for it."""

    archive_after_days: float = 30.0

    def __post_init__(self) -> None:
        if not 0 <= self.archive_after_days <= MAX_ARCHIVE_DAYS:
            raise _bad("archive_after_days", f"must be within 0..{MAX_ARCHIVE_DAYS:,} days "
                                             f"(0: never archive; got "
                                             f"{self.archive_after_days!r})")


class SelfModelSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True,
                        kw_only=True):
    """The self-model refresh: the agent's self-model is the memory of identity `identity`
    (its state items, facts and reflection); the summary keeps at most `max_entries` entries
    after duplicates are merged."""

    identity: str = "self"
    max_entries: int = 20

    def __post_init__(self) -> None:
        if not self.identity or self.identity != self.identity.strip() or "/" in self.identity:
            raise _bad("identity", f"must be a non-empty identity id without spaces around it "
                                   f"or '/' (got {self.identity!r}), e.g. 'self'")
        if not 1 <= self.max_entries <= MAX_SELF_MODEL_ENTRIES:
            raise _bad("max_entries", f"must be within 1..{MAX_SELF_MODEL_ENTRIES} (got "
                                      f"{self.max_entries!r})")


class ImportSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The imported-cognition review: an element whose writer's origin is one of `origins`
    (or one of them followed by ':' or '-') came from outside; one no person verified
    `review_after_days` after it was written is flagged (0: at the first cycle). An empty
    `origins` switches the review off."""

    origins: tuple[str, ...] = DEFAULT_IMPORT_ORIGINS
    review_after_days: float = 7.0

    def __post_init__(self) -> None:
        for origin in self.origins:
            if not origin or origin != origin.strip() or origin.partition(":")[0] in (
                    "human", "cli"):
                raise _bad("origins", f"names {origin!r}: an import origin is a non-empty "
                                      "label that is not a person's (human, cli)")
        if not 0 <= self.review_after_days <= MAX_ARCHIVE_DAYS:
            raise _bad("review_after_days", f"must be within 0..{MAX_ARCHIVE_DAYS:,} days "
                                            f"(got {self.review_after_days!r})")


class ConsolidationSettings(ModelEndpoint, frozen=True, forbid_unknown_fields=True,
                            kw_only=True):
    """Who proposes consolidated insights: "off" (the default) or "llm", a model at an
    OpenAI-compatible server (a ModelEndpoint, as the awareness layer's: `base_url` ending in
    the API version, `model`, `api_key_env` naming the variable that holds the key). At most
`max_identities` identities are consolidated per cycle (one proposer call each)."""

    proposer: str = "off"
    max_identities: int = 10

    def __post_init__(self) -> None:
        if not 1 <= self.max_identities <= 1_000:
            raise _bad("max_identities", f"must be within 1..1,000 identities per cycle "
                                         f"(got {self.max_identities!r})")
        if self.proposer not in ("off", "llm"):
            raise _bad("proposer", f"must be 'off' or 'llm' (got {self.proposer!r})")
        problem = self.endpoint_problem(required=self.proposer == "llm")
        if problem is not None:
            field, what = problem
            when = " (proposer 'llm' needs it)" if field in ("base_url", "model") \
                and self.proposer == "llm" else ""
            raise _bad(field, what + when)
        for name in ("timeout_s", "max_wall_s"):
            if not 0 < getattr(self, name) <= MAX_MODEL_S:
                raise _bad(name, f"must be within (0, {MAX_MODEL_S:,}] seconds (got "
                                 f"{getattr(self, name)!r})")


class MaintenanceSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True,
                          kw_only=True):
    """Everything the maintenance layer can be told; every field has a default.

    `grants` are the standing grants of the principal "maintenance" (a human operator writes
    them in config.json); "purge" is never among the defaults, and even when listed the cycle
    only reports purge candidates. `timeout_s` bounds one cycle's attempt.
    """

    schedule: ScheduleSettings = msgspec.field(default_factory=ScheduleSettings)
    triggers: Triggers = msgspec.field(default_factory=Triggers)
    budgets: Budgets = msgspec.field(default_factory=Budgets)
    decay: DecaySettings = msgspec.field(default_factory=DecaySettings)
    retention: RetentionSettings = msgspec.field(default_factory=RetentionSettings)
    grants: tuple[str, ...] = DEFAULT_GRANTS
    consolidation: ConsolidationSettings = msgspec.field(
        default_factory=ConsolidationSettings)
    timeout_s: float = 900.0
    self_model: SelfModelSettings = msgspec.field(default_factory=SelfModelSettings)
    imports: ImportSettings = msgspec.field(default_factory=ImportSettings)

    def __post_init__(self) -> None:
        for grant in self.grants:
            if grant not in PERMISSIONS:
                raise _bad("grants", f"names {grant!r}, which is not a permission (known: "
                                     f"{', '.join(PERMISSIONS)})")
        if not 0 < self.timeout_s <= MAX_TIMEOUT_S:
            raise _bad("timeout_s", f"must be within (0, {MAX_TIMEOUT_S:,}] seconds (24 h; got "
                                    f"{self.timeout_s!r})")


def load_settings(settings: Any) -> MaintenanceSettings:
    """`settings` as MaintenanceSettings: one already, None (the defaults), or config.json's
    object for the layer. MaintenanceSettingsError names the field that is unknown or wrong."""
    return layer_settings(settings, MaintenanceSettings, MaintenanceSettingsError, LAYER)
