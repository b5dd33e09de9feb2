"""Tick latency while the web UI serves: no client, then live streams and a client hammering
the events API, beside the same ticks next to a neutral neighbour using as much CPU.

    python -m bench.web_load [--ticks 1000] [--rounds 3] [--streams 50] [--tmp DIR]

An Engine with the `web` layer (port 0: the UI in its own process, as the daemon runs it) and
one trivial rule. Each tick comes after one new event (so every open stream has something to
send) and is followed by a 10 ms pause; only `engine.tick()` is timed. After --warmup ticks,
--rounds rounds each run three phases of --ticks ticks, alternated so drift in the machine
falls on all three alike:

- alone: the UI serves no client;
- loaded: `bench.web_client load` (a process of its own, at niceness 19 as a browser's work
  would not share the engine's priority) holds --streams /stream/events streams open and
  requests /api/events?limit=100 back to back;
- neighbour: `bench.web_client neighbour` processes with nothing of pulse in them use as much
  CPU as the UI's process (above its idle use, at its niceness) and the client (at 19) used in
  the loaded phases so far, measured with psutil.

Floor (the issue's): tick p99 loaded <= 1.2x tick p99 alone. The neighbour line says how much
of the tail any process with that CPU use brings on this machine, and the last line how the
UI's load compares with it.

    python -m bench.web_load --fanout [--streams 50] [--events 100] [--event-kib 64] [--rounds 3]

`--fanout` measures the live streams alone instead: --events large events (a task whose title
is --event-kib KiB) appended in tens while `bench.web_client load --no-api --until ...` holds
--streams streams, then the same with one stream, alternated over --rounds. For each: the UI
process's CPU per event (psutil, from the first append until the client has read every
event on every stream), event messages delivered per second, and how many messages the UI
encoded (its /metrics). No floor: the ratio of CPU per event, many streams to one, says how
much each further stream costs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import re
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

from bench.common import REPO, Figure, Floor, Report, fmt, percentile, python_module, temp_dir
from bench.web_client import TOKEN_ENV
from pulse_adapters.web import layer as web_layer
from pulse_adapters.web import read_token
from pulse_core import Decision, Engine, EventDraft, Inner, LayerContext, Snapshot, SystemClock

FLOOR_RATIO = 1.2
GAP_S = 0.010
CLIENT_NICE = 19
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
CONDITIONS = ("alone", "loaded", "neighbour")
FANOUT_TIMEOUT_S = 600.0


async def passthrough(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    """The trivial rule: hand the tick to the rest of the chain."""
    return await inner(prev, curr)


async def ticks(engine: Engine, count: int) -> list[float]:
    """Seconds each of `count` ticks took, one new event before each, GAP_S after each."""
    taken: list[float] = []
    for n in range(count):
        await engine.append([EventDraft("task-created", f"bench-{time.time_ns()}-{n}", {
            "title": "web load", "project": "bench", "prompt": "", "priority": 0})])
        started = time.perf_counter()
        await engine.tick()
        taken.append(time.perf_counter() - started)
        await asyncio.sleep(GAP_S)
    return taken


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


@dataclass
class Phase:
    """One phase's ticks, its wall time, and the CPU seconds each watched process used."""

    condition: str
    ticks: list[float]
    wall_s: float
    cpu_s: dict[str, float]
    said: str = ""

    def share(self, name: str) -> float:
        """`name`'s CPU use over the phase, as a fraction of one core."""
        return self.cpu_s.get(name, 0.0) / self.wall_s


@dataclass
class Beside:
    """A process started beside the engine, and what it printed after `ready`."""

    process: psutil.Process
    child: asyncio.subprocess.Process
    said: list[str] = field(default_factory=list)

    async def exited(self) -> None:
        """Once the process has ended on its own."""
        await self.child.wait()


@contextlib.asynccontextmanager
async def beside(argv: Sequence[str], env: dict[str, str] | None = None
                 ) -> AsyncIterator[Beside]:
    """Run `argv` until the block ends (SIGTERM, then SIGKILL); enter once it prints `ready`."""
    child = await asyncio.create_subprocess_exec(
        *argv, cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    assert child.stdout is not None
    started = Beside(psutil.Process(child.pid), child)
    try:
        try:
            line = await asyncio.wait_for(child.stdout.readline(), READY_TIMEOUT_S)
        except TimeoutError:
            line = b""
        if line.strip() != b"ready":
            child.kill()
            _, err = await child.communicate()
            raise RuntimeError(f"{' '.join(argv[:4])} did not start (said {line!r}): "
                               f"{err.decode(errors='replace')[-2000:]}")
        yield started
    finally:
        if child.returncode is None:
            child.terminate()
        try:
            out, err = await asyncio.wait_for(child.communicate(), STOP_TIMEOUT_S)
        except TimeoutError:
            child.kill()
            out, err = await child.communicate()
        started.said = out.decode(errors="replace").split()


async def measured(condition: str, engine: Engine, count: int,
                   watched: dict[str, psutil.Process], settle_s: float) -> Phase:
    """`count` ticks after `settle_s`, with the CPU time of every watched process."""
    await asyncio.sleep(settle_s)
    before = {name: cpu_seconds(p) for name, p in watched.items()}
    started = time.perf_counter()
    taken = await ticks(engine, count)
    wall = time.perf_counter() - started
    return Phase(condition, taken, wall,
                 {name: cpu_seconds(p) - before[name] for name, p in watched.items()})


async def ui_ready(home: Path) -> tuple[str, int]:
    """The UI's address and pid once it answers an authenticated API request."""
    for _ in range(int(READY_TIMEOUT_S / 0.05)):
        try:
            served = json.loads((home / "web.json").read_text())
            url, pid = str(served["url"]), int(served["pid"])
        except (OSError, ValueError, KeyError):
            await asyncio.sleep(0.05)
            continue
        async with httpx.AsyncClient() as client:
            response = await client.get(url + "api/overview", headers={
                "authorization": f"Bearer {read_token(home)}"})
        if response.status_code != 200:
            raise RuntimeError(f"the UI answered {response.status_code}: {response.text[:500]}")
        return url, pid
    raise RuntimeError(f"the web UI did not start within {READY_TIMEOUT_S:g} s (no "
                       f"{home / 'web.json'})")


def mean_share(phases: list[Phase], name: str) -> float:
    """`name`'s mean CPU use over `phases`, as a fraction of one core."""
    return sum(p.share(name) for p in phases) / len(phases)


def neighbours(loaded: list[Phase], alone: list[Phase], ui_nice: int, period_ms: float
               ) -> dict[str, list[str]]:
    """argv of the neutral processes, by the name of what each stands in for: as much CPU
    as the UI's process used in the loaded phases above its idle use (at its niceness), and as
    much as the client used (at CLIENT_NICE); one process per core's worth."""
    wanted = {"ui": (max(0.0, mean_share(loaded, "ui") - mean_share(alone, "ui")), ui_nice),
              "client": (mean_share(loaded, "client"), CLIENT_NICE)}
    argvs: dict[str, list[str]] = {}
    for name, (share, niceness) in wanted.items():
        pieces = max(1, math.ceil(share))
        for piece in range(pieces):
            argvs[f"neighbour for {name}" + (f" #{piece + 1}" if pieces > 1 else "")] = \
                python_module("bench.web_client", "neighbour", "--share", f"{share / pieces:.4f}",
                              "--nice", str(niceness), "--period-ms", str(period_ms))
    return argvs


async def rounds(engine: Engine, home: Path, args: argparse.Namespace) -> list[Phase]:
    url, pid = await ui_ready(home)
    ui = psutil.Process(pid)
    own = psutil.Process()
    await ticks(engine, args.warmup)
    env = {**os.environ, TOKEN_ENV: read_token(home)}
    client_argv = python_module("bench.web_client", "load", url, "--streams", str(args.streams),
                                "--nice", str(CLIENT_NICE))
    if not args.api:
        client_argv.append("--no-api")
    phases: list[Phase] = []
    for _ in range(args.rounds):
        watched = {"engine": own, "ui": ui}
        phases.append(await measured("alone", engine, args.ticks, watched, args.settle))
        async with beside(client_argv, env) as client:
            phase = await measured("loaded", engine, args.ticks,
                                   {**watched, "client": client.process}, args.settle)
        phase.said = " ".join(client.said)
        phases.append(phase)
        argvs = neighbours([p for p in phases if p.condition == "loaded"],
                           [p for p in phases if p.condition == "alone"], ui.nice(),
                           args.neighbour_period_ms)
        async with contextlib.AsyncExitStack() as stack:
            burners = {name: await stack.enter_async_context(beside(argv))
                       for name, argv in argvs.items()}
            phases.append(await measured(
                "neighbour", engine, args.ticks,
                {**watched, **{name: b.process for name, b in burners.items()}}, args.settle))
    return phases


@dataclass
class Fanout:
    """One fan-out phase: its streams, the UI's CPU seconds and the wall time to deliver its
    events to all of them, and what the client and the UI counted."""

    streams: int
    events: int
    wall_s: float
    ui_cpu_s: float
    said: dict[str, str]
    encoded: float


async def encoded_so_far(url: str, token: str) -> float:
    """The UI's count of event messages it encoded (NaN where it has none)."""
    async with httpx.AsyncClient() as client:
        text = (await client.get(url + "metrics", headers={
            "authorization": f"Bearer {token}"})).text
    found = re.search(r"^pulse_web_event_messages_encoded_total (\S+)$", text, re.MULTILINE)
    return float(found[1]) if found else math.nan


async def fanout_phase(engine: Engine, url: str, token: str, ui: psutil.Process, *,
                       streams: int, args: argparse.Namespace) -> Fanout:
    """--events large events delivered to `streams` streams of one client process."""
    argv = python_module("bench.web_client", "load", url, "--streams", str(streams),
                         "--no-api", "--nice", str(CLIENT_NICE),
                         "--until", str(streams * args.events))
    title = "x" * (args.event_kib * 1024)
    async with beside(argv, {**os.environ, TOKEN_ENV: token}) as client:
        await asyncio.sleep(args.settle)
        before = await encoded_so_far(url, token)
        cpu, started = cpu_seconds(ui), time.perf_counter()
        for first in range(0, args.events, 10):
            await engine.append([EventDraft("task-created", f"fanout-{time.time_ns()}-{n}", {
                "title": title, "project": "bench", "prompt": "", "priority": 0})
                for n in range(first, min(first + 10, args.events))])
        await asyncio.wait_for(client.exited(), FANOUT_TIMEOUT_S)
        wall, used = time.perf_counter() - started, cpu_seconds(ui) - cpu
        encoded = await encoded_so_far(url, token) - before
    fields = client.said
    return Fanout(streams, args.events, wall, used,
                  dict(zip(fields[::2], fields[1::2], strict=False)), encoded)


async def fanout_rounds(engine: Engine, home: Path, args: argparse.Namespace
                        ) -> list[Fanout]:
    url, pid = await ui_ready(home)
    ui, token = psutil.Process(pid), read_token(home)
    phases: list[Fanout] = []
    for _ in range(args.rounds):
        for streams in (1, args.streams):
            phases.append(await fanout_phase(engine, url, token, ui, streams=streams,
                                             args=args))
    return phases


def fanout_report(phases: list[Fanout], args: argparse.Namespace) -> Report:
    report = Report(f"web_load --fanout: {args.events} events of {args.event_kib} KiB to "
                    f"{args.streams} live streams vs 1 (the UI's CPU from the first append "
                    f"until every stream read every event); {args.rounds} rounds")

    def pooled(streams: int) -> tuple[float, float]:
        mine = [p for p in phases if p.streams == streams]
        cpu = sum(p.ui_cpu_s for p in mine) / sum(p.events for p in mine)
        rate = sum(p.streams * p.events for p in mine) / sum(p.wall_s for p in mine)
        return cpu, rate

    many, one = pooled(args.streams), pooled(1)
    report.compare(Figure(f"UI CPU per event with {args.streams} streams", many[0] * 1000, "ms"),
                   Figure("UI CPU per event with 1 stream", one[0] * 1000, "ms"))
    report.compare(Figure(f"event messages delivered with {args.streams} streams", many[1],
                          "msg/s"),
                   Figure("event messages delivered with 1 stream", one[1], "msg/s"))
    for p in phases:
        report.note(f"{p.streams} stream(s): {p.events} events in {fmt(p.wall_s)} s, UI CPU "
                    f"{fmt(p.ui_cpu_s)} s, encoded by the UI {fmt(p.encoded)}, client read "
                    f"{p.said.get('messages', '?')} messages, reconnected "
                    f"{p.said.get('reconnects', '?')} times")
    return report


def report_of(phases: list[Phase], args: argparse.Namespace) -> Report:
    by = {c: [p for p in phases if p.condition == c] for c in CONDITIONS}
    pooled = {c: [t for p in by[c] for t in p.ticks] for c in CONDITIONS}
    load = f"{args.streams} streams + {'API client' if args.api else 'no API requests'}"
    report = Report(f"web_load: tick latency with no client vs {load} (UI in its own process), "
                    f"beside a neutral neighbour of the same CPU use; {args.rounds} rounds of "
                    f"{args.ticks} ticks per phase")

    def figure(condition: str, p: int) -> Figure:
        label = {"alone": "with no client", "loaded": f"with {load}",
                 "neighbour": "beside a neutral CPU neighbour"}[condition]
        return Figure(f"tick p{p} {label}", percentile(pooled[condition], p) * 1000, "ms")

    for p in (50, 99):
        loaded, alone = figure("loaded", p), figure("alone", p)
        floor = Floor.ratio_at_most(loaded.value / alone.value, FLOOR_RATIO) if p == 99 else None
        report.compare(loaded, alone, floor=floor)
    for p in (50, 99):
        report.compare(figure("neighbour", p), figure("alone", p))
    report.compare(figure("loaded", 99), figure("neighbour", 99))

    def shares(condition: str) -> str:
        names = sorted({n for phase in by[condition] for n in phase.cpu_s})
        return ", ".join(f"{n} {fmt(100 * mean_share(by[condition], n))}%" for n in names)

    for c in CONDITIONS:
        per_round = " / ".join(fmt(percentile(p.ticks, 99) * 1000) for p in by[c])
        report.note(f"{c}: {len(pooled[c])} ticks, p99 per round {per_round} ms; CPU (% of a "
                    f"core) {shares(c)}")
    for phase in by["loaded"]:
        fields = phase.said.split()
        said = dict(zip(fields[::2], fields[1::2], strict=False))
        report.note(f"load client over {fmt(phase.wall_s)} s: {said.get('requests', '?')} API "
                    f"requests (p50 {said.get('api_p50_ms', '?')} ms, p99 "
                    f"{said.get('api_p99_ms', '?')} ms), {said.get('messages', '?')} stream "
                    "messages read")
    return report


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.web_load", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ticks", type=int, default=1000, help="timed ticks per phase (1000)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of alone / loaded / neighbour phases (3)")
    parser.add_argument("--warmup", type=int, default=200, help="untimed ticks first (200)")
    parser.add_argument("--streams", type=int, default=50, help="live streams (50)")
    parser.add_argument("--no-api", dest="api", action="store_false",
                        help="streams only: the client makes no API requests")
    parser.add_argument("--neighbour-period-ms", type=float, default=10.0,
                        help="the neutral neighbour works in slices of this period (10 ms)")
    parser.add_argument("--settle", type=float, default=1.0,
                        help="seconds between a phase's processes being ready and its ticks (1)")
    parser.add_argument("--tmp", default=None, help="base directory for the engine home")
    parser.add_argument("--fanout", action="store_true",
                        help="measure the live streams' fan-out instead (see above)")
    parser.add_argument("--events", type=int, default=100,
                        help="--fanout: events per phase (100)")
    parser.add_argument("--event-kib", type=int, default=64,
                        help="--fanout: each event's size in KiB (64)")
    return parser.parse_args(argv)


async def run(args: argparse.Namespace) -> Report:
    with temp_dir(args.tmp) as home:
        web = web_layer({"port": 0}, LayerContext(home, SystemClock()))
        async with Engine(home, layers=[web], rules=[passthrough], default_tick_ms=3_600_000,
                          builtin_rules=[]) as engine:
            if args.fanout:
                return fanout_report(await fanout_rounds(engine, home, args), args)
            phases = await rounds(engine, home, args)
    return report_of(phases, args)


def main(argv: Sequence[str] | None = None) -> int:
    return asyncio.run(run(parse(argv))).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
