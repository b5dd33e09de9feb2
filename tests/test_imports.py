"""The import rule: arrows point down, and the core loads no network library."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
UPPER = ("pulse_survival", "pulse_adapters", "pulse_cli", "engine_template")


def test_pulse_core_imports_nothing_above_it() -> None:
    pattern = re.compile(rf"^\s*(from|import)\s+({'|'.join(UPPER)})\b", re.M)
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "pulse_core").rglob("*.py")
                 if pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_pulse_survival_imports_neither_adapters_nor_cli() -> None:
    pattern = re.compile(r"^\s*(from|import)\s+(pulse_adapters|pulse_cli)\b", re.M)
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "pulse_survival").rglob("*.py")
                 if pattern.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


def test_importing_pulse_core_loads_no_network_library() -> None:
    code = ("import sys, pulse_core\n"
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in "
            "{'httpx', 'httpcore', 'dns', 'watchfiles', 'pulse_survival', 'pulse_adapters', "
            "'pulse_cli', 'anyio', 'h11', 'asyncpg', 'psycopg', 'psycopg_pool', 'redis'})\n"
            "print(','.join(bad))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == ""


def test_the_kernel_does_not_load_the_seed_004_building_blocks() -> None:
    code = ("import sys, pulse_core, pulse_core.memory, pulse_core.store\n"
            "print(','.join(sorted(m for m in sys.modules "
            "if m.startswith('pulse_core.maintenance'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    assert out.stdout.strip() == ""
