"""The facts survival rules write down about their own reasoning, as typed marks.

A rule returns marks among its effects; the engine stores each as a `mark` event and never
executes it; the SurvivalLedger folds them back. Counters, backoffs and once-only markers
therefore live in the log, not in rule objects: a restarted engine carries on where the last
one stopped, and two engines reading the same log decide the same.
"""

from __future__ import annotations

from pulse_core import Mark


class StreakCounted(Mark, tag="survival-streak"):
    """`rule`'s condition has now held for `count` samples in a row (0: the streak broke, or
    its action fired and counting starts again)."""

    rule: str
    count: int


class StartFailed(Mark, tag="process-start-failed"):
    """The restart of `name` made at `restart_at` was seen dead before it stayed up
    `startsecs`: one more failed start in a row."""

    name: str
    restart_at: int


class StartHeld(Mark, tag="process-start-held"):
    """`name` was seen up for `startsecs` after the restart made at `restart_at` (None: it
    came up without a restart of ours): its failed starts are back to zero."""

    name: str
    restart_at: int | None = None


class GaveUp(Mark, tag="process-gave-up"):
    """process_watchdog stopped restarting `name`, because of `why`."""

    name: str
    why: str


class Recovered(Mark, tag="process-recovered"):
    """`name`, given up earlier, is alive again (as `pid`): it is watched and restarted again
    from a clean count of failed starts."""

    name: str
    pid: int | None = None


class RequestHandled(Mark, tag="process-request-handled"):
    """process_watchdog acted on the operator's request `request` (the seq of its
    `process-requested` event) to `action` essential process `name`, at `at` (engine clock,
    ms): a stop keeps `name` stopped until it is started again; a start, restart or reset
    supervises it again from a clean count (failed starts, the hourly budget from `at`)."""

    name: str
    request: int
    action: str
    at: int


class LlmRestartScheduled(Mark, tag="llm-restart-scheduled"):
    """llm_watchdog restarted the model proxy: the `count`th restart since the route was last
    healthy; the next one is not before `next_allowed_at` (ms)."""

    count: int
    next_allowed_at: int


class LlmRouteHealthy(Mark, tag="llm-route-healthy"):
    """The LLM route answered again after restarts: the restart count is back to zero."""


class NetworkOutageAnnounced(Mark, tag="network-outage-announced"):
    """network_watchdog announced an outage (`failing`: the probe kinds that failed); it says
    nothing more until the network is back."""

    failing: tuple[str, ...] = ()


class NetworkRecoveryAnnounced(Mark, tag="network-recovery-announced"):
    """network_watchdog announced that the network is back; the next outage is news again."""


class ErrorsEscalated(Mark, tag="errors-escalated"):
    """error_escalate notified `matches` error lines at `at` (ms), in one digest; it patrols
    faster for `patrol_for_s` after that and sends no other digest for `digest_every_s`.

    `run`, `total` and `by_pattern` are the error-log watcher's totals the digest counted up
    to: the next digest counts the lines after them.
    """

    at: int
    matches: int
    run: str = ""
    total: int = 0
    by_pattern: dict[str, int] = {}  # noqa: RUF012 - msgspec copies mutable defaults


SURVIVAL_MARKS: tuple[type[Mark], ...] = (
    StreakCounted, StartFailed, StartHeld, GaveUp, Recovered, RequestHandled, LlmRestartScheduled,
    LlmRouteHealthy, NetworkOutageAnnounced, NetworkRecoveryAnnounced, ErrorsEscalated,
)
"""Every mark the survival rules write."""
