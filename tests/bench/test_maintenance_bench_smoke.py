"""bench.maintenance at a tiny size, so it cannot rot: every cycle decays every element once,
the restarted reader resumes from its checkpoint, and the report prints figure | limit |
ratio. Timings are not judged here."""

from __future__ import annotations

import importlib
import re
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(r"^(?P<figure>[^|]+): (?P<value>[\d,.]+) (?P<unit>[^|]+) \| "
                  r"(?P<limit>[^|]+): (?P<limit_value>[\d,.]+) (?P<limit_unit>[^|]+) \| "
                  r"ratio (?P<ratio>[\d.]+|inf) \((?P<floor>[^)]*)\)(?P<verdict> PASS| FAIL)?$")


def bench() -> ModuleType:
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))
    return importlib.import_module("bench.maintenance")


def number(text: str) -> float:
    return float(text.replace(",", ""))


def test_cycles_after_a_restart_and_with_a_kept_reader_decay_every_element_beside_a_raw_update(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    bench().main(["--elements", "1200", "--identities", "30", "--tmp", str(tmp_path)])
    out = capsys.readouterr().out  # the exit code is the floors' verdict: timing, not judged
    lines = {m["figure"]: m for m in map(LINE.match, out.splitlines()) if m}
    restart = "first cycle after a restart over 1,200 elements (reader from its checkpoint)"
    kept = "next cycle, kept reader, over 1,200 elements"
    first = "first cycle ever (no checkpoint: whole-log fold) over 1,200 elements"
    assert set(lines) == {restart, kept, first, "events appended by a cycle",
                          "appends made by a cycle"}, out
    for name in (restart, kept, first):
        assert lines[name]["limit"] == "raw sqlite3 UPDATE of 1,200 rows' strength", out
        assert number(lines[name]["value"]) > 0 and number(lines[name]["limit_value"]) > 0
    assert lines[restart]["verdict"] and lines[kept]["verdict"] and not lines[first]["verdict"]
    writes = lines["events appended by a cycle"]
    assert number(writes["limit_value"]) == 1200, out  # every element decayed
    assert 0 < number(writes["value"]) < 1200, out  # one event carries many records
    appends = lines["appends made by a cycle"]
    # one batch of the default 10,000 elements holds them all: one append
    assert number(appends["value"]) == number(appends["limit_value"]) == 1, out
    assert "WARNING" not in out and "resumed from its checkpoint at seq" in out, out
    assert "resumed from its checkpoint at seq 0;" not in out, out
