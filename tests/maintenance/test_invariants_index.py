"""Seed 004's section 37 lists 27 maintenance invariants: each has exactly one test, named
`test_invariant_NN_<what it promises>`, in a tests/maintenance/test_invariants_*.py file."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAME = re.compile(r"^test_invariant_(\d\d)_[a-z0-9_]+$")
INVARIANTS = 27


def _invariant_tests() -> list[tuple[int, str, str]]:
    found: list[tuple[int, str, str]] = []
    for path in sorted(HERE.glob("test_invariants_*.py")):
        if path.name == Path(__file__).name:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                match = NAME.match(node.name)
                if match:
                    found.append((int(match.group(1)), node.name, path.name))
    return found


def test_every_invariant_of_seed_004_has_exactly_one_test() -> None:
    counts = Counter(number for number, _, _ in _invariant_tests())
    missing = [n for n in range(1, INVARIANTS + 1) if counts[n] == 0]
    repeated = sorted(n for n, c in counts.items() if c > 1)
    unknown = sorted(n for n in counts if not 1 <= n <= INVARIANTS)
    assert (missing, repeated, unknown) == ([], [], [])


def test_every_invariant_test_has_a_body_that_asserts() -> None:
    for path in sorted(HERE.glob("test_invariants_*.py")):
        if path.name == Path(__file__).name:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and NAME.match(
                    node.name):
                checks = [n for n in ast.walk(node) if isinstance(n, ast.Assert | ast.With
                                                                  | ast.AsyncWith)]
                assert checks, f"{path.name}::{node.name} asserts nothing"
