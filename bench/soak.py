"""A long run of a real `upulse` daemon with every layer that runs here: does its memory stay flat?

    python -m bench.soak [--minutes 60] [--every 30] [--tick-ms 1000]

`upulse init` makes a home in a temporary folder; config.json switches on the survival layer
(an essential process kept by pidfile, a disk path, an error log, an HTTP target, a notify log),
the web UI (its own process, port 0), the maintenance layer (a cycle every 3-6 minutes) and the
awareness layer with a loopback stand-in for its model (pulse_adapters.llm.stand_in.ChatServer:
route probes answered, no review asked of it, since nothing human happens). `upulse daemon start`
runs it. Every `--every` seconds this process scrapes the UI's /metrics and /api/events (as a
monitor would) and samples, with psutil, the daemon's RSS and CPU time (and its children's: the
UI), and counts `error` and `effect-failed` events in the log.

Prints one row per sample, then RSS at start, half-way and end, and the RSS slope (MiB/hour, a
least-squares fit) over the first and the last half of the run. Floor: the last half's slope
is below `--max-slope` MiB/hour (a leak grows on; a warming cache levels off) and no errors.
The run ends by itself after `--minutes`; the daemon is stopped and the home removed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from bench.common import REPO, Figure, Floor, Report, fmt, temp_dir
from pulse_adapters.llm.stand_in import ChatServer

MIB = 1024 * 1024
SLEEPER = "import time\nwhile True:\n    time.sleep(3600)\n"


@dataclass(frozen=True)
class Sample:
    """One reading of the daemon: seconds since start, RSS (MiB) of the daemon and of its
    children, CPU (% of a core) since the previous reading, and error events so far."""

    at_s: float
    rss_mib: float
    children_mib: float
    cpu_percent: float
    errors: int
    events: int


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60.0, help="length (default 60)")
    parser.add_argument("--every", type=float, default=30.0, help="sample every (30 s)")
    parser.add_argument("--tick-ms", type=int, default=1_000, help="default_tick_ms (1000)")
    parser.add_argument("--max-slope", type=float, default=1.0,
                        help="floor: last half's RSS slope in MiB/hour (default 1.0)")
    parser.add_argument("--tmp", default=None, help="base directory for the home")
    return parser.parse_args(argv)


def upulse(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """`python -m pulse_cli ARGS --home HOME`; raises when it exits non-zero."""
    env = {**os.environ, "HOME": str(home.parent), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "pulse_cli", *args, "--home", str(home)],
                          env=env, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"upulse {' '.join(args)} exited {done.returncode}: "
                           f"{done.stdout}{done.stderr}")
    return done


def configure(home: Path, model_url: str, tick_ms: int) -> None:
    """Every layer that runs on this machine, in config.json."""
    (home / "sleeper.py").write_text(SLEEPER)
    (home / "watched.log").write_text("")
    config = json.loads((home / "config.json").read_text())
    config["default_tick_ms"] = tick_ms
    config["survival"] = {
        "disk_paths": [str(home)],
        "processes": [{"name": "sleeper", "argv": [sys.executable, str(home / "sleeper.py")],
                       "pidfile": str(home / "sleeper.pid"),
                       "log": str(home / "sleeper.log")}],
        "network": {"http_urls": [f"{model_url}/models"], "interval_s": 10.0},
        "error_log": {"files": [str(home / "watched.log")]},
        "notify": {"log_file": str(home / "notify.log")},
    }
    config["layers"] = {
        "web": {"port": 0, "live_every_s": 1.0},
        "maintenance": {"schedule": {"every_h": [0.05, 0.1]}},
        "awareness": {"base_url": model_url, "model": "stand-in", "route_ttl_s": 10.0},
    }
    (home / "config.json").write_text(json.dumps(config, indent=2))


def start_sleeper(home: Path) -> None:
    """The essential process, started once by hand; the survival layer keeps it alive."""
    proc = subprocess.Popen([sys.executable, str(home / "sleeper.py")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    (home / "sleeper.pid").write_text(str(proc.pid))


def daemon_process(home: Path, bound_s: float = 60.0) -> psutil.Process:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        try:
            return psutil.Process(int((home / "daemon.pid").read_text()))
        except (OSError, ValueError, psutil.NoSuchProcess):
            time.sleep(0.2)
    raise RuntimeError(f"no daemon.pid in {home} after {bound_s:g} s")


def web_url(home: Path, bound_s: float = 60.0) -> str:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        try:
            return str(json.loads((home / "web.json").read_text())["url"])
        except (OSError, ValueError, KeyError):
            time.sleep(0.2)
    raise RuntimeError(f"the web UI wrote no {home / 'web.json'} in {bound_s:g} s")


def counts(home: Path) -> tuple[int, int]:
    """(error + effect-failed events, all events) in the home's log, read-only."""
    with sqlite3.connect(f"file:{home / 'events.db'}?mode=ro", uri=True, timeout=30) as db:
        errors = db.execute("SELECT count(*) FROM events WHERE kind IN "
                            "('error', 'effect-failed')").fetchone()[0]
        total = db.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]
    return int(errors), int(total)


def cpu_seconds(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def scrape(client: httpx.Client, url: str, token: str) -> None:
    """What a monitor does: /metrics and the newest page of events."""
    for path in ("metrics", "api/events?limit=100"):
        client.get(f"{url.rstrip('/')}/{path}",
                   headers={"Authorization": f"Bearer {token}"}).raise_for_status()


def slope_mib_per_hour(samples: Sequence[Sample]) -> float:
    """Least-squares slope of RSS over time, MiB per hour (0 with fewer than 2 samples)."""
    if len(samples) < 2:
        return 0.0
    xs = [s.at_s / 3600 for s in samples]
    ys = [s.rss_mib for s in samples]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    den = sum((x - mx) ** 2 for x in xs)
    return 0.0 if den == 0 else sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / den


def sample(proc: psutil.Process, started: float, last: tuple[float, float],
           home: Path) -> tuple[Sample, tuple[float, float]]:
    now, cpu = time.monotonic(), cpu_seconds(proc)
    children = proc.children(recursive=True)
    child_rss = sum(c.memory_info().rss for c in children if c.is_running())
    errors, events = counts(home)
    used = 100 * (cpu - last[1]) / max(now - last[0], 1e-9)
    return (Sample(now - started, proc.memory_info().rss / MIB, child_rss / MIB, used,
                   errors, events), (now, cpu))


def run(args: argparse.Namespace) -> Report:
    report = Report(f"soak: a daemon with survival, web, maintenance and awareness, "
                    f"{args.minutes:g} min, sampled every {args.every:g} s")
    samples: list[Sample] = []
    with temp_dir(args.tmp) as tmp, ChatServer() as model, httpx.Client(timeout=30) as client:
        home = tmp / "home"
        upulse(home, "init")
        configure(home, model.base_url, args.tick_ms)
        start_sleeper(home)
        upulse(home, "daemon", "start")
        try:
            proc = daemon_process(home)
            url, token = web_url(home), (home / "ui.token").read_text().strip()
            started = time.monotonic()
            last = (started, cpu_seconds(proc))
            print(f"{'min':>6} {'rss MiB':>8} {'ui MiB':>7} {'cpu %':>6} {'errors':>6} "
                  f"{'events':>7}", flush=True)
            end = started + args.minutes * 60
            while True:
                scrape(client, url, token)
                reading, last = sample(proc, started, last, home)
                samples.append(reading)
                print(f"{reading.at_s / 60:6.1f} {reading.rss_mib:8.1f} "
                      f"{reading.children_mib:7.1f} {reading.cpu_percent:6.2f} "
                      f"{reading.errors:6d} {reading.events:7d}", flush=True)
                if time.monotonic() >= end:
                    break
                time.sleep(min(args.every, max(end - time.monotonic(), 0.0)))
        finally:
            upulse(home, "daemon", "stop")
            stop_sleeper(home)
    half = len(samples) // 2
    first, second = slope_mib_per_hour(samples[:half + 1]), slope_mib_per_hour(samples[half:])
    middle = samples[half]
    report.note(f"daemon RSS: start {fmt(samples[0].rss_mib)} MiB, at {middle.at_s / 60:.0f} "
                f"min {fmt(middle.rss_mib)} MiB, end {fmt(samples[-1].rss_mib)} MiB; UI "
                f"process {fmt(samples[0].children_mib)} -> {fmt(samples[-1].children_mib)} MiB")
    cpu = sum(s.cpu_percent for s in samples[1:]) / max(len(samples) - 1, 1)
    report.note(f"daemon CPU {cpu:.2f} % of a core on average; {samples[-1].events} events")
    late = Figure("RSS slope, last half", second, "MiB/hour")
    report.compare(late, Figure("RSS slope, first half", first, "MiB/hour"),
                   floor=Floor.below(late, args.max_slope, "slope"))
    errors = Figure("error and effect-failed events", samples[-1].errors, "events")
    report.compare(errors, Figure("allowed", 0, "events"), floor=Floor.below(errors, 1))
    return report


def stop_sleeper(home: Path) -> None:
    with contextlib.suppress(OSError, ValueError):
        os.kill(int((home / "sleeper.pid").read_text()), signal.SIGTERM)


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse(argv)).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
