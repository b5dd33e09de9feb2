"""bench.awareness at a tiny size: an unchanged world costs exactly its quiet-ceiling checkpoints.

Unlike the other smoke tests this one judges correctness, not speed: 50 identities over 3
simulated hours must cost one first review each plus one review per quiet_ceiling_s, quiet
skips must write no events, and every skip must be accounted for. The timing floors (and the
gap floor) are not judged here.
"""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

TEST_TIME_LIMIT_S = 60

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^(?P<figure>[^|]+): (?P<value>[\d,.]+) (?P<unit>[^|]+) \| "
                  r"(?P<limit>[^|]+): (?P<limit_value>[\d,.]+) (?P<limit_unit>[^|]+) \| "
                  r"ratio (?P<ratio>[\d.]+|inf) \((?P<floor>[^)]*)\)(?P<verdict> PASS| FAIL)?$")


def bench() -> ModuleType:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module("bench.awareness")


def number(text: str) -> float:
    return float(text.replace(",", ""))


def line(lines: list[re.Match[str]], figure: str) -> re.Match[str]:
    """The first report line whose figure starts with `figure`."""
    return next(m for m in lines if m["figure"].startswith(figure))


def test_unchanged_worlds_cost_only_quiet_ceiling_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bench().main(["--identities", "50", "--hours", "3", "--limit-ticks", "5",
                  "--tmp", str(tmp_path)])
    out = capsys.readouterr().out
    lines = [m for m in map(LINE.match, out.splitlines()) if m]
    assert len(lines) == 8, out
    assert sum(1 for m in lines if m["verdict"]) == 5, out

    calls = line(lines, "model calls")
    # 50 first reviews (30 s after each exchange) + 2 ceiling checkpoints each within 3 h.
    assert calls["limit"].startswith("quiet-ceiling floor (50 first reviews + 100 ceiling"), out
    assert number(calls["value"]) == number(calls["limit_value"]) == 150, out
    assert calls["verdict"] == " PASS", out

    events = line(lines, "events written per simulated hour")
    assert number(events["value"]) == number(events["limit_value"]) > 0, out
    assert events["verdict"] == " PASS", out

    skips = line(lines, "quiet skips counted")
    assert 0 < number(skips["value"]) <= number(skips["limit_value"]), out
    assert skips["verdict"] == " PASS", out

    per_tick = [m for m in lines if m["figure"].startswith("awareness rule per tick p")]
    assert [m["limit"] for m in per_tick] == [
        "bare heapq push+pop of 50 items", "bare heapq push+pop of 50 items",
        "empty tick of the same engine, awareness rule off, p50", "engine rule_timeout"], out
    assert all(number(m["value"]) > 0 and number(m["limit_value"]) > 0 for m in per_tick), out
    assert "longest gap between two reviews" in out

    assert "reviews by reason: {'changed': 50, 'ceiling': 100}; other effects: none" in out
    carried = re.search(r"carried into reviews ([\d,]+) \+ still held ([\d,]+) = ([\d,]+) "
                        r"\(counted ([\d,]+): ([\d,]+) checks made, ([\d,]+) deemed made\)", out)
    assert carried, out
    assert number(carried[1]) + number(carried[2]) == number(carried[4]) == number(
        skips["value"]) == number(carried[5]) + number(carried[6]), out
    assert number(carried[5]) < number(carried[6]), out  # an unchanged world's checks: deemed
    assert "tick 30" in out and "error" not in out, out  # one tick record per review tick


def test_the_expectation_is_on_the_tick_grid() -> None:
    awareness = bench()
    config = awareness.AwarenessConfig()
    start = awareness.START_MS
    hour = 3_600_000
    # exchange at 0: reviews at 30 s, 3,630 s, 7,230 s; at exactly 3 h + 29 s the third is due.
    assert awareness.expected_reviews(start, start + 3 * hour, config, 30_000) == (3, 2)
    assert awareness.expected_reviews(start, start + 7_229_999, config, 30_000) == (2, 1)
    # an exchange between ticks is reviewed at the first tick after its initial delay.
    assert awareness.expected_reviews(start + 10_000, start + 40_000, config, 30_000) == (0, 0)
    assert awareness.expected_reviews(start + 10_000, start + 60_000, config, 30_000) == (1, 0)
