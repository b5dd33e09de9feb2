"""Agent runs: a pending task -> dispatched, run as a subprocess, closed, through the engine.

    python -m bench.agent_runs [--tasks 200]

An engine on a SQLite home runs a TaskDispatcher and an AgentRunExecutor whose "agent" is this
interpreter printing one NDJSON result line. Each task is created, then `engine.step()` runs
the tick (the dispatch) and the executor until idle: assign, start, spawn in a new process
group, read the stream, kill and reap the group, store the transcript, ack and close. One
sample is one task's whole step.

Limit: the same program started bare with asyncio.create_subprocess_exec, its stdout read and
the process awaited (what any runner of an external agent pays). Floor: the median run costs
at most 3 times the bare spawn: the dispatch, the seven task and effect events (four commits)
and the group's kill and reap must stay small beside starting a program.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from bench.common import Figure, Floor, Report, median, percentile, temp_dir
from pulse_adapters.agents import (
    AgentOutputError,
    AgentResult,
    AgentRun,
    AgentRunExecutor,
    AgentSpec,
    AgentStream,
    Program,
    ProgramCheck,
    StreamLimits,
    TaskDispatcher,
)
from pulse_core import Effect, Engine, ManualClock, TaskBoard

FLOOR_RATIO = 3.0
AGENT = ("import json, sys; print(json.dumps({'type': 'result', 'result': 'did ' + "
         "sys.argv[1]}), flush=True)")


class BenchRun(AgentRun, tag="bench-agent-run"):
    """One task run by the bench's agent."""


class BenchExecutor(AgentRunExecutor):
    """Runs this interpreter as the agent: one JSON line, the result."""

    handles: ClassVar[tuple[type[Effect], ...]] = (BenchRun,)

    def argv(self, run: AgentRun, program: str) -> Sequence[str]:
        return [program, "-c", AGENT, run.task_id]

    def parse(self, run: AgentRun, stream: AgentStream) -> AgentResult:
        results = [e for e in stream.json_lines() if e.get("type") == "result"]
        if not results:
            raise AgentOutputError("no result line")
        return AgentResult(result=results[-1]["result"])


async def run_latencies(home: Path, tasks: int) -> list[float]:
    """Seconds of `engine.step()` that takes each new task from pending to closed."""
    check = ProgramCheck(Program(field="bench.program", argv0=sys.executable,
                                 min_version="3.11"), name="bench-program")
    executor = BenchExecutor(check, run_timeout_s=30.0, limits=StreamLimits(kill_grace_s=1.0))
    dispatcher = TaskDispatcher(BenchRun, [AgentSpec(name="bench")], program=check)
    engine = Engine(home, rules=[dispatcher], executors=[executor], clock=ManualClock())
    await engine.open()
    try:
        await check.require()
        board = TaskBoard(engine.events)
        latencies: list[float] = []
        for n in range(tasks):
            await board.create(f"t-{n}", "bench", prompt="run")
            t0 = time.perf_counter()
            await engine.step()
            latencies.append(time.perf_counter() - t0)
            task = await board.state(f"t-{n}")
            if task is None or task.status != "closed":
                raise RuntimeError(f"task t-{n} is {task and task.status}, not closed")
    finally:
        await engine.close()
    return latencies


async def bare_latencies(count: int) -> list[float]:
    """Seconds to start the same program bare, read its stdout and await it."""
    latencies: list[float] = []
    for n in range(count):
        t0 = time.perf_counter()
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-c", AGENT, f"t-{n}", stdout=asyncio.subprocess.PIPE)
        await process.communicate()
        latencies.append(time.perf_counter() - t0)
    return latencies


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.agent_runs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=200, help="tasks (default 200)")
    parser.add_argument("--tmp", default=None, help="base directory for the home")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> Report:
    report = Report(f"agent runs: pending task -> closed, through the engine, {args.tasks:,} "
                    "tasks")
    with temp_dir(args.tmp) as tmp:
        runs = await run_latencies(tmp / "home", args.tasks)
    bare = await bare_latencies(args.tasks)
    for p in (50, 99):
        value = median(runs) if p == 50 else percentile(runs, p)
        limit = median(bare) if p == 50 else percentile(bare, p)
        figure = Figure(f"agent run p{p}", value * 1000, "ms")
        spawn = Figure(f"bare subprocess spawn+exit p{p}", limit * 1000, "ms")
        floor = Floor.ratio_at_most(value / limit, FLOOR_RATIO) if p == 50 else None
        report.compare(figure, spawn, floor=floor)
    report.note("a run is one engine step: tick (dispatch), assign, start, spawn, stream, "
                "group kill and reap, transcript, ack and close")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse(argv))).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
