"""AgentRunExecutor: the one subprocess executor every host's runs go through.

A host subclass says only how to start its program (`argv`, and `cwd` and `env` if it needs
them) and what its output means (`parse`). The base assigns the task at the version it was
dispatched at (never twice), starts it, runs the program in a new process group within the
run timeout, stores the transcript, and moves the task on: acked and closed on success,
requeued or given up by the DispatchPolicy on failure, each step a task event. A store that
is unavailable as a run ends is waited for (RECORD_PATIENCE_S), so a finished run is recorded
rather than run again once its task is found stuck.
"""

from __future__ import annotations

import abc
import asyncio
import math
import os
import socket
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from pulse_adapters.agents._effects import AgentRun, TaskTimedOut, timed_out_type
from pulse_adapters.agents._process import (
    ProcessOutcome,
    StreamLimits,
    end_leftover,
    run_process,
    started_at,
)
from pulse_adapters.agents._program import ProgramCheck
from pulse_adapters.agents._spec import DispatchPolicy
from pulse_adapters.agents._stream import AgentOutputError, AgentResult, AgentStream
from pulse_core import (
    Effect,
    EventDraft,
    EventStore,
    ExecutionContext,
    Executor,
    InvalidTransition,
    TaskBoard,
    TaskState,
    VersionConflict,
    register_kind,
    stored_next,
    wait_ended,
    write_through_outage,
)

SPAWNED = "agent-run-spawned"


class RunSpawned(msgspec.Struct, frozen=True):
    """agent-run-spawned: the process group a run of task `task_id` started on `host`
    (its leader `pid`, started at `started`), so a later run or a takeover of the task
    ends what an engine that died mid-run left running."""

    effect_id: str
    task_id: str
    pid: int
    started: float
    host: str


register_kind(SPAWNED, "an agent run's process group started; key: agent-run:<task id>",
              RunSpawned)

_MARGIN_S = 60.0  # Executor.timeout above the run's own: store writes and the kill grace

RECORD_PATIENCE_S = 45.0
"""How long the end of a run waits for an unavailable store to take the task's move (within
the executor's timeout margin); past it the effect fails, and the task, still executing, is
requeued when the dispatcher finds it stuck."""
_OPEN = frozenset({"assigned", "executing"})
_SHORTEST_SECRET = 8
_SHORTEST_PIECE = 4  # of a secret a bound cut: a shorter piece tells nothing of it


class AgentRunExecutor(Executor):
    """Runs a host's AgentRun effects (and its stuck tasks' TaskTimedOut) as subprocesses.

    Subclass with `handles = (MyRun,)` (the TaskTimedOut type of each run type is added) and
    implement `argv` and `parse`. `program` is the layer's ProgramCheck; `run_timeout_s`
    bounds one run (the executor's own `timeout` is set above it, so the run's timeout, which
    kills the process group and settles the task, comes first). A run is one attempt: a
    failure is settled on the task, which the dispatcher hands out again.
    """

    max_attempts = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        runs = [t for t in cls.__dict__.get("handles", ()) if issubclass(t, AgentRun)]
        extra = tuple(timed_out_type(t) for t in runs if timed_out_type(t) not in cls.handles)
        cls.handles = (*cls.handles, *extra)

    def __init__(self, program: ProgramCheck, *, policy: DispatchPolicy | None = None,
                 run_timeout_s: float = 1800.0, limits: StreamLimits | None = None) -> None:
        if not run_timeout_s > 0:
            raise ValueError(f"run_timeout_s must be > 0 seconds (got {run_timeout_s})")
        if not math.isfinite(run_timeout_s):
            raise ValueError(f"run_timeout_s must be a finite number of seconds (got "
                             f"{run_timeout_s})")
        self.program = program
        self.policy = policy or DispatchPolicy()
        self.run_timeout_s = run_timeout_s
        self.limits = limits or StreamLimits()
        self.timeout = run_timeout_s + 2 * self.limits.kill_grace_s + _MARGIN_S

    # -- what a host says --------------------------------------------------------------------

    @abc.abstractmethod
    def argv(self, run: AgentRun, program: str) -> Sequence[str]:
        """The command line of `run`, starting with `program` (the checked program's path)."""

    def cwd(self, run: AgentRun) -> str | Path | None:
        """The folder `run` runs in (None: the engine's)."""
        return None

    def env(self, run: AgentRun) -> Mapping[str, str]:
        """Variables set over the engine's environment for `run`."""
        return {}

    def secrets(self, run: AgentRun) -> Sequence[str]:
        """Values `run` may print that must never be stored (a model key a provider echoes
        in its error): `redact` takes them out of the transcript, the stderr tail, the
        reasons and the result, and a piece of one (from 4 characters) that the stderr tail
        starts with or a transcript cut at max_stdout_bytes ends with. Default: none; values
        shorter than 8 characters are ignored (no secret, and replacing them would mangle
        the text)."""
        return ()

    def redact(self, run: AgentRun, text: str) -> str:
        """`text` with each of `run`'s `secrets` replaced by `[redacted]`."""
        for secret in self.secrets(run):
            if len(secret) >= _SHORTEST_SECRET:
                text = text.replace(secret, "[redacted]")
        return text

    def _redact_bytes(self, run: AgentRun, data: bytes, *, cut_before: bool = False,
                      cut_after: bool = False) -> bytes:
        """`data` redacted; where a bound cut the output just before it (`cut_before`) or
        just after it (`cut_after`), a piece of a secret it starts or ends with goes too."""
        for secret in self.secrets(run):
            if len(secret) >= _SHORTEST_SECRET:
                raw = secret.encode()
                data = _cut_pieces(data.replace(raw, b"[redacted]"), raw,
                                   start=cut_before, end=cut_after)
        return data

    @abc.abstractmethod
    def parse(self, run: AgentRun, stream: AgentStream) -> AgentResult:
        """What the output of a run that exited with 0 means; AgentOutputError when it does
        not follow the host's protocol."""

    # -- the run -----------------------------------------------------------------------------

    async def execute(self, effect: Effect, ctx: ExecutionContext) -> dict[str, Any]:
        board = TaskBoard(ctx.events, origin=f"executor:{self.name}")
        if isinstance(effect, TaskTimedOut):
            return await self._time_out(board, effect)
        if not isinstance(effect, AgentRun):
            raise TypeError(f"{self.name} runs AgentRun effects, not {type(effect).__name__}")
        program = await self.program.require()  # ProgramUnavailable: the run fails finally
        task = await board.state(effect.task_id)
        try:
            if task is None or task.version != effect.task_version:
                raise VersionConflict(effect.task_id, effect.task_version,
                                      0 if task is None else task.version)
            assigned = await board.assign(effect.task_id, effect.agent,
                                          expect_version=effect.task_version)
        except (VersionConflict, InvalidTransition) as exc:
            return {"dispatched": False, "reason": str(exc)}
        started = await board.start(effect.task_id, expect_version=assigned.version)
        try:  # a cancellation while a leftover group is ended requeues the task too
            await self._end_leftover(ctx.events, effect.task_id)
            outcome = await self._spawn(effect, program, ctx)
        except asyncio.CancelledError:
            await asyncio.shield(self._settle(
                board, task, started.version, "interrupted: the run was cancelled (engine "
                "stopping, or the executor's timeout) and its processes were killed",
                force_requeue=True))
            raise
        except Exception as exc:  # the program could not start (gone since the check...)
            reason = f"could not run {program}: {type(exc).__name__}: {exc}"
            state = await self._settle(board, task, started.version, reason)
            return {"dispatched": True, "ok": False, "task": state, "reason": reason}
        # The process has ended: its outcome is recorded even if the attempt is cancelled now
        # (a requeue would run again a task whose work is done).
        finishing = asyncio.ensure_future(self._finish(
            board, effect, task, started.version, outcome=outcome, events=ctx.events))
        try:
            return await asyncio.shield(finishing)
        except asyncio.CancelledError:
            await wait_ended(finishing)  # a second cancel leaves it recording, not cut
            raise

    async def _spawn(self, run: AgentRun, program: str, ctx: ExecutionContext
                     ) -> ProcessOutcome:
        argv = [str(part) for part in self.argv(run, program)]
        cwd = self.cwd(run)

        async def spawned(pid: int) -> None:
            body = RunSpawned(ctx.effect_id, run.task_id, pid, started_at(pid) or 0.0,
                              socket.gethostname())
            await ctx.events.append([EventDraft(SPAWNED, f"agent-run:{run.task_id}",
                                                msgspec.to_builtins(body),
                                                origin=f"executor:{self.name}")])

        return await run_process(argv, cwd=None if cwd is None else str(cwd),
                                 env={**os.environ, **self.env(run)},
                                 timeout_s=self.run_timeout_s, limits=self.limits,
                                 spawned=spawned)

    async def _end_leftover(self, events: EventStore, task_id: str) -> bool:
        """End the process group of this task's last run when an engine that died mid-run
        left it running on this host (True when there was one)."""
        last = await events.read(key=f"agent-run:{task_id}", kinds=[SPAWNED],
                                 newest_first=True, limit=1)
        if not last:
            return False
        body = last[0].payload(RunSpawned)
        if body.host != socket.gethostname():
            return False
        return await end_leftover(body.pid, body.started, self.limits.kill_grace_s)

    async def _finish(self, board: TaskBoard, run: AgentRun, task: TaskState, version: int, *,
                      outcome: ProcessOutcome, events: EventStore) -> dict[str, Any]:
        limits, tail = self.limits, outcome.stderr_tail
        stderr_tail = self._redact_bytes(run, tail,
                                         cut_before=len(tail) >= limits.stderr_tail_bytes)
        stderr = stderr_tail.decode("utf-8", errors="replace")
        transcript = stderr_digest = None
        if events.objects is not None:
            transcript = await events.objects.put(self._redact_bytes(
                run, outcome.stdout, cut_after=len(outcome.stdout) >= limits.max_stdout_bytes))
            if stderr_tail:
                stderr_digest = await events.objects.put(stderr_tail)
        record: dict[str, Any] = {
            "dispatched": True, "exit_code": outcome.exit_code,
            "duration_ms": outcome.duration_ms, "transcript": transcript,
            "stderr": stderr_digest, "truncated": outcome.truncated}
        parsed: AgentResult | None = None
        last_err = stderr.strip().splitlines()[-1][:300] if stderr.strip() else "none"
        if outcome.timed_out:
            reason = (f"timed out after {self.run_timeout_s:g} s (run_timeout_s); its process "
                      f"group was killed")
        elif outcome.exit_code != 0:
            reason = f"exited with {outcome.exit_code} (last stderr line: {last_err})"
        else:
            stream = AgentStream(outcome.lines, stderr, outcome.exit_code, outcome.truncated,
                                 outcome.cut_lines)
            try:
                parsed = self.parse(run, stream)
                msgspec.json.encode(parsed.result)  # it goes into task-acked
            except AgentOutputError as exc:
                reason = f"malformed output: {exc}"
            except Exception as exc:  # the host's parser failed: the task must not hang
                parsed = None
                reason = f"the output could not be read: {type(exc).__name__}: {exc}"
            else:
                reason = "" if parsed.ok else f"the agent reported an error: {parsed.error}"
        reason = self.redact(run, reason)
        if parsed is not None:
            redacted = self.redact(run, msgspec.json.encode(parsed.result).decode())
            session = None if parsed.session is None else self.redact(run, parsed.session)
            parsed = msgspec.structs.replace(parsed, result=msgspec.json.decode(redacted),
                                             session=session)
        try:
            if parsed is not None and not reason:
                result = {"result": parsed.result, "session": parsed.session,
                          "transcript": transcript, "exit_code": outcome.exit_code,
                          "duration_ms": outcome.duration_ms}
                await _move_through_outage(
                    lambda: board.ack_and_close(run.task_id, result, expect_version=version),
                    board, run.task_id, version, kind="task-acked", data={"result": result})
                return {**record, "ok": True, "task": "closed", "session": parsed.session}
            state = await self._settle(board, task, version, f"{run.agent}: {reason}")
        except (VersionConflict, InvalidTransition) as exc:  # taken back meanwhile
            return {**record, "ok": parsed is not None and not reason, "task": "moved-on",
                    "reason": f"{reason or 'finished'}; not recorded on the task: {exc}"}
        return {**record, "ok": False, "task": state, "reason": reason}

    async def _settle(self, board: TaskBoard, task: TaskState, version: int, reason: str, *,
                      force_requeue: bool = False) -> str:
        """Requeue or give up the task (at `version`) by the policy; the status it took
        ("moved-on" when another writer moved it first)."""
        try:
            if force_requeue or self.policy.requeues(task.requeues):
                # an interrupted run's requeue does not hold up a stop for a store outage
                await _move_through_outage(
                    lambda: board.requeue(task.id, reason, expect_version=version),
                    board, task.id, version, kind="task-requeued", data={"reason": reason},
                    patience=0.0 if force_requeue else RECORD_PATIENCE_S)
                return "requeued"
            limit = (f"requeued {task.requeues} times (max_requeues="
                     f"{self.policy.max_requeues})" if self.policy.requeue_on_failure
                     else "requeue_on_failure is off")
            why = f"{reason}; {limit}"
            await _move_through_outage(
                lambda: board.give_up(task.id, why, expect_version=version),
                board, task.id, version, kind="task-given-up", data={"reason": why})
        except (VersionConflict, InvalidTransition):
            return "moved-on"
        return "given-up"

    async def _time_out(self, board: TaskBoard, effect: TaskTimedOut) -> dict[str, Any]:
        task = await board.state(effect.task_id)
        if task is None or task.version != effect.task_version or task.status not in _OPEN:
            now = "absent" if task is None else f"{task.status} at version {task.version}"
            return {"timed_out": False, "reason": f"task {effect.task_id!r} moved on ({now})"}
        reason = effect.reason
        if await self._end_leftover(board.store, effect.task_id):
            reason += "; the process group its last run left running was killed"
        state = await self._settle(board, task, task.version, reason)
        return {"timed_out": state != "moved-on", "task": state, "reason": effect.reason}


async def _move_through_outage(move: Callable[[], Awaitable[object]], board: TaskBoard,
                               task_id: str, version: int, *, kind: str, data: Any,
                               patience: float = RECORD_PATIENCE_S) -> None:
    """`move()`, the move of task `task_id` from `version` by a `kind` event holding `data`,
    through a store outage of `patience` seconds at most (write_through_outage): after a
    lost reply, a conflict where the task's next event is this very move counts as done."""
    mine = EventDraft(kind, task_id, data, origin=board.origin)
    await write_through_outage(
        move, patience_s=patience, what=f"task {task_id}'s {kind}",
        written=lambda: stored_next(board.store, task_id, version, mine))


def _cut_pieces(data: bytes, secret: bytes, *, start: bool, end: bool) -> bytes:
    """`data` with the longest piece of `secret` (from _SHORTEST_PIECE bytes) it starts with
    (`start`: the secret's end) or ends with (`end`: its beginning) replaced by
    `[redacted]`."""
    for size in range(len(secret) - 1, _SHORTEST_PIECE - 1, -1):
        if start and data.startswith(secret[-size:]):
            data, start = b"[redacted]" + data[size:], False
        if end and data.endswith(secret[:size]):
            data, end = data[:-size] + b"[redacted]", False
    return data
