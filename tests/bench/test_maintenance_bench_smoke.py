"""bench.maintenance at a tiny size, so it cannot rot: one full cycle decays every element
once and the report prints figure | limit | ratio. Timings are not judged here."""

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


def test_one_full_cycle_decays_every_element_once_beside_a_raw_update(
    tmp_path: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    assert bench().main(["--elements", "1200", "--identities", "30", "--tmp",
                         str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = {m["figure"]: m for m in map(LINE.match, out.splitlines()) if m}
    assert set(lines) == {"maintenance cycle over 1,200 elements",
                          "events appended by the cycle", "appends made by the cycle"}, out
    cycle = lines["maintenance cycle over 1,200 elements"]
    assert cycle["limit"] == "raw sqlite3 UPDATE of 1,200 rows' strength", out
    assert number(cycle["value"]) > 0 and number(cycle["limit_value"]) > 0, out
    writes = lines["events appended by the cycle"]
    assert number(writes["limit_value"]) == 1200, out  # every element decayed
    assert 0 < number(writes["value"]) < 1200, out  # one event carries many records
    appends = lines["appends made by the cycle"]
    assert number(appends["value"]) == number(appends["limit_value"]) == 3, out
    assert "WARNING" not in out and "warnings none" in out, out
