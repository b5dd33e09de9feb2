"""One agent process: spawned from argv alone in a new process group, its output read within
bounds, and the whole group killed and waited for however the run ends (exit, timeout,
cancellation), so no process of it outlives the run."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Mapping, Sequence

import msgspec
import psutil

_CHUNK = 65_536
_POLL_S = 0.02
GONE_WITHIN_S = 10.0
"""How long a killed group's members are waited for after SIGKILL."""


class StreamLimits(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Bounds on what is kept of an agent's output, and the grace before SIGKILL.

    A stdout line longer than `max_line_bytes` is cut there; past `max_stdout_bytes` of
    stdout, the rest is read and dropped (the stream is marked truncated); the last
    `stderr_tail_bytes` of stderr are kept. `kill_grace_s` is the time between SIGTERM and
    SIGKILL to the process group.
    """

    max_line_bytes: int = 1_000_000
    max_stdout_bytes: int = 32_000_000
    stderr_tail_bytes: int = 16_000
    kill_grace_s: float = 5.0


class ProcessOutcome(msgspec.Struct, frozen=True):
    """How the process ended and what it wrote (within the limits)."""

    stdout: bytes
    lines: tuple[str, ...]
    stderr_tail: bytes
    exit_code: int | None
    timed_out: bool
    truncated: bool
    duration_ms: int


class _Lines:
    """Stdout cut into lines, each line and the whole within bounds."""

    def __init__(self, limits: StreamLimits) -> None:
        self.limits = limits
        self.raw = bytearray()
        self.lines: list[str] = []
        self.truncated = False
        self._line = bytearray()
        self._cut = False  # the current line passed max_line_bytes: drop until its end

    def feed(self, chunk: bytes) -> None:
        room = self.limits.max_stdout_bytes - len(self.raw)
        if room < len(chunk):
            self.truncated = True
            chunk = chunk[:max(room, 0)]
        self.raw += chunk
        start = 0
        while start < len(chunk):
            end = chunk.find(b"\n", start)
            piece = chunk[start:] if end < 0 else chunk[start:end]
            self._add(piece)
            if end < 0:
                break
            self._end_line()
            start = end + 1

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
        self._line.clear()
        self._cut = False

    def close(self) -> None:
        if self._line:
            self._end_line()


async def _read_stdout(stream: asyncio.StreamReader, lines: _Lines) -> None:
    while chunk := await stream.read(_CHUNK):
        lines.feed(chunk)


async def _read_tail(stream: asyncio.StreamReader, keep: int) -> bytes:
    tail = bytearray()
    while chunk := await stream.read(_CHUNK):
        tail += chunk
        del tail[:max(len(tail) - keep, 0)]
    return bytes(tail)


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


async def kill_group(proc: asyncio.subprocess.Process, grace_s: float) -> None:
    """End process group `proc.pid`: SIGTERM, then SIGKILL after `grace_s` to whatever is
    left, and wait until the leader is reaped and no live member remains."""
    pgid = proc.pid
    if proc.returncode is None and _signal_group(pgid, signal.SIGTERM):
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), grace_s)
    await end_group(proc)


async def end_group(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL what is left of process group `proc.pid` and wait for all of it."""
    pgid = proc.pid
    _signal_group(pgid, signal.SIGKILL)
    await proc.wait()
    # Members that outlived the leader were re-parented; their new parent reaps them.
    await asyncio.to_thread(_wait_group_gone, pgid)


def _wait_group_gone(pgid: int) -> None:
    """SIGKILL group `pgid` until no live member is left, or GONE_WITHIN_S passed (a process
    stuck in the kernel cannot be killed); blocking: run it in a thread."""
    deadline = time.monotonic() + GONE_WITHIN_S
    while _signal_group(pgid, signal.SIGKILL) and _members(pgid):
        if time.monotonic() > deadline:
            return
        time.sleep(_POLL_S)


async def run_process(argv: Sequence[str], *, cwd: str | None, env: Mapping[str, str],
                      timeout_s: float, limits: StreamLimits) -> ProcessOutcome:
    """Run `argv` (no shell) in a new process group with stdin closed, until it exits or
    `timeout_s` passes; the group is ended either way, and when the caller is cancelled.

    OSError when the program cannot be started (missing, not executable, bad cwd).
    """
    began = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=dict(env), stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        start_new_session=True)
    assert proc.stdout is not None and proc.stderr is not None
    lines = _Lines(limits)
    reading = asyncio.gather(_read_stdout(proc.stdout, lines),
                             _read_tail(proc.stderr, limits.stderr_tail_bytes))
    timed_out = False
    try:
        try:
            async with asyncio.timeout(timeout_s):
                await proc.wait()
        except TimeoutError:
            timed_out = True
            await kill_group(proc, limits.kill_grace_s)
        else:
            await end_group(proc)  # what it left behind holds the pipes open
        _, tail = await reading
    except BaseException:
        reading.cancel()
        # Cancelled (or failing) mid-run: end the group whatever happens to this task next.
        ending = asyncio.ensure_future(kill_group(proc, limits.kill_grace_s))
        with contextlib.suppress(BaseException):
            await asyncio.shield(ending)
        with contextlib.suppress(BaseException):
            await reading
        raise
    lines.close()
    return ProcessOutcome(bytes(lines.raw), tuple(lines.lines), tail, proc.returncode,
                          timed_out, lines.truncated,
                          int((time.perf_counter() - began) * 1000))
