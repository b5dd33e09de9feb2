"""The effect, executor and journal shared by the e2e tests and their child processes.

Importable two ways: by the tests (as part of the `tests/e2e` package) and by the child
scripts, which run by path and so find this file as the top-level module `workload`.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import ClassVar

from pulse_core import Effect, ExecutionContext, Executor


class Work(Effect, tag="work"):
    """A unit of work numbered `n`."""

    n: int


def journal_line(path: Path, line: str) -> None:
    """Append one line to `path` with a single O_APPEND write (atomic between processes)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (line + "\n").encode())
    finally:
        os.close(fd)


def read_journal(path: Path) -> list[list[str]]:
    """The journal's lines, split into fields (an absent journal is empty)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [line.split() for line in text.splitlines() if line.strip()]


class JournalExecutor(Executor):
    """Runs `Work`: writes `enter <id> <attempt>` and `done <id> <attempt>` around its work.

    The first attempt of an effect whose number is in `blockers` sleeps (for `block_s`) so a
    test can kill the process in the middle of it; later attempts finish at once.
    """

    handles: ClassVar[tuple[type[Effect], ...]] = (Work,)
    timeout = 120.0
    max_attempts = 5

    def __init__(
        self, journal: Path, blockers: frozenset[int] = frozenset(), block_s: float = 600.0
    ) -> None:
        self.journal = journal
        self.blockers = blockers
        self.block_s = block_s

    async def execute(self, effect: Work, ctx: ExecutionContext) -> dict[str, int]:
        journal_line(self.journal, f"enter {ctx.effect_id} {ctx.attempt}")
        if effect.n in self.blockers and ctx.attempt == 1:
            await asyncio.sleep(self.block_s)
        journal_line(self.journal, f"done {ctx.effect_id} {ctx.attempt}")
        return {"n": effect.n, "pid": os.getpid()}


class PidJournalExecutor(Executor):
    """Runs `Work`: writes `<pid> <effect_id> <attempt>`, then works for `work_s` seconds."""

    handles: ClassVar[tuple[type[Effect], ...]] = (Work,)
    timeout = 60.0

    def __init__(self, journal: Path, work_s: float = 0.005) -> None:
        self.journal = journal
        self.work_s = work_s

    async def execute(self, effect: Work, ctx: ExecutionContext) -> dict[str, int]:
        journal_line(self.journal, f"{os.getpid()} {ctx.effect_id} {ctx.attempt}")
        await asyncio.sleep(self.work_s)
        return {"n": effect.n, "pid": os.getpid()}


async def watchdog(max_seconds: float) -> None:
    """End this child if its parent goes away or it outlives `max_seconds`: no orphans."""
    parent = os.getppid()
    for _ in range(int(max_seconds / 0.2)):
        if os.getppid() != parent:
            break
        await asyncio.sleep(0.2)
    os._exit(3)
