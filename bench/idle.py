"""CPU and memory of an idle engine, beside an idle asyncio loop measured the same way.

    python -m bench.idle [--seconds 60] [--watchers 4] [--interval 5]

Two child processes start together (`python -m bench.idle_child`): an Engine with `--watchers`
watchers sampling every `--interval` seconds, on top of the survival layer's own watchers
(default tick, executor scan and housekeeping), and a bare `asyncio.run(asyncio.sleep(...))`.
Once both print `ready` and `--settle` seconds pass, this process reads their CPU time (user +
system, all threads) with psutil over the same `--seconds` window and their RSS at its end.
Floor: the engine uses < 1% of one core.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from bench.common import Figure, Floor, Report, measure_children, python_module, temp_dir

FLOOR_CPU_PERCENT = 1.0
STAY_UP_MARGIN = 3.0


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.idle", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="window (default 60 s)")
    parser.add_argument("--watchers", type=int, default=4, help="watchers (default 4)")
    parser.add_argument("--interval", type=float, default=5.0, help="watcher interval (5 s)")
    parser.add_argument("--settle", type=float, default=2.0,
                        help="seconds after start-up before the window opens (default 2)")
    parser.add_argument("--tmp", default=None, help="base directory for the engine home")
    return parser.parse_args(argv)


def run(args: argparse.Namespace, title: str = "idle") -> Report:
    extra = (f"{args.watchers} watchers every {args.interval:g} s" if args.watchers
             else "only the survival layer's watchers")
    report = Report(f"{title}: engine with {extra} vs an idle asyncio loop, "
                    f"{args.seconds:g} s window, separate processes")
    stay_up = str(args.settle + args.seconds + STAY_UP_MARGIN)
    with temp_dir(args.tmp) as tmp:
        engine, bare = measure_children(
            [python_module("bench.idle_child", "engine", "--home", str(tmp / "home"),
                           "--seconds", stay_up, "--watchers", str(args.watchers),
                           "--interval", str(args.interval)),
             python_module("bench.idle_child", "asyncio", "--seconds", stay_up)],
            args.seconds, settle=args.settle,
        )
    cpu = Figure("idle engine CPU", engine.cpu_percent, "% of a core")
    report.compare(cpu, Figure("idle asyncio loop CPU", bare.cpu_percent, "% of a core"),
                   floor=Floor.below(cpu, FLOOR_CPU_PERCENT, "CPU"))
    report.compare(Figure("idle engine RSS", engine.rss_mib, "MiB"),
                   Figure("idle asyncio loop RSS", bare.rss_mib, "MiB"))
    report.note(f"engine ran {engine.said} (the survival layer's watchers are always there; "
                f"--watchers {args.watchers} added {extra if args.watchers else 'none'})")
    report.note(f"CPU time over {engine.wall_seconds:.1f} s: engine {engine.cpu_seconds:.2f} s, "
                f"asyncio loop {bare.cpu_seconds:.2f} s (psutil, clock-tick resolution 10 ms)")
    return report


def main(argv: Sequence[str] | None = None) -> int:
    return run(parse(argv)).exit_code()


if __name__ == "__main__":
    raise SystemExit(main())
