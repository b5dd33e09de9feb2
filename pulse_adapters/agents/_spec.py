"""What a host layer says about its agents and how its tasks are handed out."""

from __future__ import annotations

import math

import msgspec


class AgentSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One agent a host layer runs tasks on.

    `name` is the agent's id (the `agent` of `task-assigned`, unique across layers);
    `projects` the task projects it takes ("*": any); `concurrency` how many tasks it runs
    at once. A host subclasses it for what only it needs (a repository folder, a profile).
    """

    name: str
    projects: tuple[str, ...] = ("*",)
    concurrency: int = 1

    def __post_init__(self) -> None:
        if not self.name.strip() or self.name != self.name.strip():
            raise ValueError(f"`name` must be a non-empty id without surrounding spaces "
                             f"(got {self.name!r})")
        if not self.projects:
            raise ValueError('`projects` must name at least one project, or "*" for any')
        if self.concurrency < 1:
            raise ValueError(f"`concurrency` must be >= 1 (got {self.concurrency})")

    def takes(self, project: str) -> bool:
        """Whether this agent takes tasks of `project`."""
        return "*" in self.projects or project in self.projects


class DispatchPolicy(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """When a task is taken back from its agent, and when it is given up.

    A task assigned longer than `stuck_after_s` with no run under way is stuck. A failed
    run (non-zero exit, malformed output, its timeout) or a stuck task is requeued while
    `requeue_on_failure` holds and the task was requeued fewer than `max_requeues` times;
    otherwise it is given up.
    """

    stuck_after_s: float = 3600.0
    max_requeues: int = 2
    requeue_on_failure: bool = True

    def __post_init__(self) -> None:
        if not self.stuck_after_s > 0:
            raise ValueError(f"`stuck_after_s` must be > 0 seconds (got {self.stuck_after_s})")
        if not math.isfinite(self.stuck_after_s):
            raise ValueError(f"`stuck_after_s` must be a finite number of seconds (got "
                             f"{self.stuck_after_s})")
        if self.max_requeues < 0:
            raise ValueError(f"`max_requeues` must be >= 0 (got {self.max_requeues})")

    def requeues(self, requeued_so_far: int) -> bool:
        """Whether a task requeued `requeued_so_far` times goes back to pending once more."""
        return self.requeue_on_failure and requeued_so_far < self.max_requeues
