"""One agent process: spawned from argv alone in a new process group, its output read within
bounds, and the whole group killed and waited for however the run ends (exit, timeout,
cancellation), so no process of it outlives the run.

The process's end is its exit, not the closing of its pipes: a process that left the group
(its own `setsid`) may hold them open for ever, so once the group is gone what is still
buffered is read for at most DRAIN_S and the pipes are closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

import msgspec
import psutil

from pulse_core import process_started, started_on_wall_clock, wait_ended

_POLL_S = 0.02
GONE_WITHIN_S = 10.0
"""How long a killed group's members are waited for after SIGKILL."""
DRAIN_S = 1.0
"""How long output still buffered is read once the group is gone, before the pipes are
closed (only a process that left the group keeps them open longer)."""


class StreamLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Bounds on what is kept of an agent's output, and the grace before SIGKILL.

    A stdout line longer than `max_line_bytes` is cut there; past `max_stdout_bytes` of
    stdout, or past `max_lines` lines, the rest is read and dropped (the stream is marked
    truncated, and the lines cut are named, so a parser can skip them); the last
    `stderr_tail_bytes` of stderr are kept. `kill_grace_s` is the time between SIGTERM and
    SIGKILL to the process group.
    """

    max_line_bytes: int = 1_000_000
    max_stdout_bytes: int = 32_000_000
    stderr_tail_bytes: int = 16_000
    kill_grace_s: float = 5.0
    max_lines: int = 100_000

    def __post_init__(self) -> None:
        for field in ("max_line_bytes", "max_stdout_bytes", "stderr_tail_bytes", "max_lines"):
            if getattr(self, field) < 1:
                raise ValueError(f"`{field}` must be >= 1 (got {getattr(self, field)})")
        if not (math.isfinite(self.kill_grace_s) and self.kill_grace_s >= 0):
            raise ValueError(f"`kill_grace_s` must be a finite number of seconds >= 0 (got "
                             f"{self.kill_grace_s})")


class ProcessOutcome(msgspec.Struct, frozen=True):
    """How the process ended and what it wrote (within the limits); `cut_lines` are the
    numbers (from 1) of the lines a bound cut short."""

    stdout: bytes
    lines: tuple[str, ...]
    stderr_tail: bytes
    exit_code: int | None
    timed_out: bool
    truncated: bool
    duration_ms: int
    cut_lines: tuple[int, ...] = ()


class _Lines:
    """Stdout cut into lines, each line, their number and the whole within bounds."""

    def __init__(self, limits: StreamLimits) -> None:
        self.limits = limits
        self.raw = bytearray()
        self.lines: list[str] = []
        self.cut: list[int] = []
        self.truncated = False
        self._line = bytearray()
        self._cut = False  # the current line passed max_line_bytes: drop until its end
        self._over = False  # max_stdout_bytes reached: the current line ends cut
        self._full = False  # max_lines reached: only the transcript takes more

    def feed(self, chunk: bytes) -> None:
        room = self.limits.max_stdout_bytes - len(self.raw)
        if room < len(chunk):
            self.truncated = self._over = True
            chunk = chunk[:max(room, 0)]
        self.raw += chunk
        *ended, rest = chunk.split(b"\n")  # in C: a flood of line ends costs no Python loop
        for piece in ended:
            if self._full:
                self.truncated = True
                return
            self._add(piece)
            self._end_line()
        if rest:
            if self._full:
                self.truncated = True
                return
            self._add(rest)

    def _add(self, piece: bytes) -> None:
        if self._cut:
            return
        room = self.limits.max_line_bytes - len(self._line)
        if len(piece) > room:
            self._line += piece[:room]
            self._cut = self.truncated = True
        else:
            self._line += piece

    def _end_line(self) -> None:
        self.lines.append(self._line.decode("utf-8", errors="replace").rstrip("\r"))
        if self._cut:
            self.cut.append(len(self.lines))
        self._line.clear()
        self._cut = False
        self._full = len(self.lines) >= self.limits.max_lines

    def close(self) -> None:
        if self._line:
            self._cut = self._cut or self._over
            self._end_line()


class _Output(asyncio.SubprocessProtocol):
    """An agent process's stdout (as `_Lines`) and stderr tail as they come, and events for
    its exit and for both pipes closed."""

    def __init__(self, limits: StreamLimits) -> None:
        self.lines = _Lines(limits)
        self.tail = bytearray()
        self.exited = asyncio.Event()
        self.closed = asyncio.Event()
        self._keep = limits.stderr_tail_bytes
        self._open = {1, 2}

    def pipe_data_received(self, fd: int, data: bytes | str) -> None:
        chunk = data.encode() if isinstance(data, str) else data
        if fd == 1:
            self.lines.feed(chunk)
        else:
            self.tail += chunk
            del self.tail[:max(len(self.tail) - self._keep, 0)]

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        self._open.discard(fd)
        if not self._open:
            self.closed.set()

    def process_exited(self) -> None:
        self.exited.set()


class _Child:
    """A spawned group leader: its pid, exit code, and a wait for its exit alone (asyncio's
    Process.wait also waits for its pipes to close)."""

    def __init__(self, transport: asyncio.SubprocessTransport, output: _Output) -> None:
        self.transport = transport
        self.output = output
        self.pid = transport.get_pid()

    @property
    def returncode(self) -> int | None:
        return self.transport.get_returncode()

    async def wait(self) -> int | None:
        await self.output.exited.wait()
        return self.returncode


def _members(pgid: int) -> list[int]:
    """The live (not zombie) processes of group `pgid`."""
    found = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getpgid(proc.pid) == pgid:
                found.append(proc.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def _signal_group(pgid: int, sig: signal.Signals) -> bool:
    """Send `sig` to the group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


async def kill_group(proc: _Child, grace_s: float) -> None:
    """End process group `proc.pid`: SIGTERM, then SIGKILL after `grace_s` to whatever is
    left, and wait until the leader is reaped and no live member remains."""
    pgid = proc.pid
    if proc.returncode is None and _signal_group(pgid, signal.SIGTERM):
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(grace_s):
                await proc.wait()
    await end_group(proc)


async def end_group(proc: _Child) -> None:
    """SIGKILL what is left of process group `proc.pid` and wait for all of it."""
    pgid = proc.pid
    _signal_group(pgid, signal.SIGKILL)
    await proc.wait()
    # Members that outlived the leader were re-parented; their new parent reaps them.
    await asyncio.to_thread(_wait_group_gone, pgid)


def started_at(pid: int, *, wall_clock: bool = False) -> float | None:
    """When process `pid` started (pulse_core.process_started: on the clock since boot, or
    with `wall_clock` on the wall clock), None when there is none. A zombie counts: a dead
    engine's group leader may wait unreaped as one while the rest of its group still runs."""
    return process_started(pid, zombie=True, wall_clock=wall_clock) or None


async def end_leftover(pid: int, started: float, grace_s: float) -> bool:
    """End the process group an earlier run left (its engine died mid-run): SIGTERM, SIGKILL
    after `grace_s`, then wait for the group. True when there was one (see `_left_by`)."""
    return await asyncio.to_thread(_end_leftover, pid, started, grace_s)


def _end_leftover(pid: int, started: float, grace_s: float) -> bool:
    if not _left_by(pid, started):
        return False
    _term_then_kill(pid, grace_s)
    return True


def _left_by(pid: int, started: float) -> bool:
    """Whether group `pid` is still the one a run's leader `pid`, started at `started`, led:
    the leader runs as that same process and leads its group; or the leader is gone and
    members of its group started since run on (the kernel gives no process a pid still
    naming a group). A pid another process holds now is left alone. Blocking: run it in a
    thread."""
    wall_clock = started_on_wall_clock(started)  # as runs spawned by earlier versions hold it
    now = started_at(pid, wall_clock=wall_clock)
    if now is None:
        return any((started_at(member, wall_clock=wall_clock) or 0.0) >= started - 0.01
                   for member in _members(pid))
    try:
        return abs(now - started) < 0.01 and os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def _term_then_kill(pgid: int, grace_s: float) -> None:
    """SIGTERM group `pgid`, wait up to `grace_s` for it, then SIGKILL what is left and wait
    for it; blocking: run it in a thread."""
    _signal_group(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _members(pgid) and time.monotonic() < deadline:
        time.sleep(_POLL_S)
    _wait_group_gone(pgid)


def _wait_group_gone(pgid: int) -> None:
    """SIGKILL group `pgid` until no live member is left, or GONE_WITHIN_S passed (a process
    stuck in the kernel cannot be killed); blocking: run it in a thread."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while _signal_group(pgid, signal.SIGKILL) and _members(pgid):
        if time.monotonic() > deadline:
            return
        time.sleep(_POLL_S)


async def run_process(argv: Sequence[str], *, cwd: str | None, env: Mapping[str, str],
                      timeout_s: float, limits: StreamLimits,
                      spawned: Callable[[int], Awaitable[None]] | None = None
                      ) -> ProcessOutcome:
    """Run `argv` (no shell) in a new process group with stdin closed, until it exits or
    `timeout_s` passes; the group is ended either way, and when the caller is cancelled.
    `spawned(pid)` is awaited once the group leader runs (a failure there ends the group).

    OSError when the program cannot be started (missing, not executable, bad cwd).
    """
    began = time.perf_counter()
    output = _Output(limits)
    transport, _ = await asyncio.get_running_loop().subprocess_exec(
        lambda: output, *argv, cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    proc = _Child(transport, output)
    timed_out = False
    try:
        if spawned is not None:
            await spawned(proc.pid)
        try:
            async with asyncio.timeout(timeout_s):
                await proc.wait()
        except TimeoutError:
            timed_out = True
            await kill_group(proc, limits.kill_grace_s)
        else:
            await end_group(proc)  # what it left behind holds the pipes open
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(DRAIN_S):
                await output.closed.wait()
    except BaseException:
        # Cancelled (or failing) mid-run: end the group whatever happens to this task next.
        await wait_ended(asyncio.ensure_future(kill_group(proc, limits.kill_grace_s)))
        raise
    finally:
        transport.close()
    lines = output.lines
    lines.close()
    return ProcessOutcome(bytes(lines.raw), tuple(lines.lines), bytes(output.tail),
                          proc.returncode, timed_out, lines.truncated,
                          int((time.perf_counter() - began) * 1000), tuple(lines.cut))
