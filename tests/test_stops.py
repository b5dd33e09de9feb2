"""A stop is never lost in the packages' own code: nothing there swallows a cancellation
around an await (ruff's TID251 bans asyncio.wait_for, which can, on Python 3.11)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pulse_core", "pulse_survival", "pulse_adapters", "pulse_cli", "engine_template")


def test_no_package_suppresses_cancelled_error() -> None:
    """`with suppress(CancelledError): await task` (or BaseException) also swallows a cancel
    of the awaiting task itself; wait for the task with `pulse_core.wait_ended` instead."""
    pattern = re.compile(r"suppress\([^)]*(CancelledError|BaseException)")
    offenders = [f"{path.relative_to(ROOT)}:{number}"
                 for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
                 for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
                 if pattern.search(line)]
    assert offenders == []
