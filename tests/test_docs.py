"""Every ```python block in README.md and docs/*.md is a complete program, and it runs.

Each block runs as its own pytest case, in a subprocess, in a fresh temporary directory with
HOME and UPULSE_HOME pointed inside it, so an example can never touch the reader's real home.
It runs as a reader's copy would, from the installed packages: the checkout is not on its
path, and no block may import the test suite.
Shell commands and output belong in ```bash or ```text fences, config files in ```ini or
```json (each ```json block must parse); none of those is run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = "python"
NOT_RUN = {"bash", "text", "ini", "json"}
TIMEOUT_S = 30  # every block takes about a second; a hang should fail soon
TEST_TIME_LIMIT_S = TIMEOUT_S * 2 + 30  # conftest's hard limit: above any timeout here

_FENCE = re.compile(r"^```(\S*)\s*$")
_IMPORTS_TESTS = re.compile(r"^\s*(?:from\s+tests(?:\.|\s)|import\s+(?:.*,\s*)?tests\b)",
                            re.MULTILINE)


@dataclass(frozen=True)
class Block:
    """One fenced code block: its page, the line of its opening fence, language and source."""

    page: Path
    line: int
    lang: str
    source: str

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT).as_posix()}:{self.line}"


def fenced_blocks(page: Path) -> list[Block]:
    """The fenced blocks of `page`, with the 1-based line number of each opening fence."""
    blocks: list[Block] = []
    opened: tuple[int, str] | None = None
    body: list[str] = []
    for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), start=1):
        match = _FENCE.match(line)
        if match is None:
            if opened is not None:
                body.append(line)
            continue
        if opened is None:
            opened, body = (number, match.group(1)), []
        else:
            blocks.append(Block(page, opened[0], opened[1], "\n".join(body) + "\n"))
            opened = None
    if opened is not None:
        raise AssertionError(f"{page}:{opened[0]}: code fence is never closed")
    return blocks


ALL_BLOCKS = [block for page in PAGES for block in fenced_blocks(page)]
PYTHON_BLOCKS = [block for block in ALL_BLOCKS if block.lang == RUNNABLE]


def test_every_fence_names_a_known_language() -> None:
    """An unlabelled or misspelt fence (```py) would silently escape being run."""
    wrong = [f"{b.id} ```{b.lang}" for b in ALL_BLOCKS if b.lang not in {RUNNABLE, *NOT_RUN}]
    assert not wrong, (f"use ```python (runs), ```bash, ```text, ```ini or ```json (not run): "
                       f"{wrong}")


def test_every_json_block_is_json() -> None:
    """A config snippet a reader pastes into config.json must at least be JSON."""
    wrong = []
    for block in (b for b in ALL_BLOCKS if b.lang == "json"):
        try:
            json.loads(block.source)
        except ValueError as exc:
            wrong.append(f"{block.id}: {exc}")
    assert not wrong, f"```json blocks that are not JSON: {wrong}"


def test_every_docs_page_has_a_runnable_example() -> None:
    pages = {b.page for b in PYTHON_BLOCKS}
    missing = [p.name for p in PAGES if p.name != "index.md" and p not in pages]
    assert not missing, f"pages without a ```python example: {missing}"


def test_python_blocks_type_check(tmp_path: Path) -> None:
    """The examples are typed code a reader will copy: mypy --strict accepts every one."""
    pytest.importorskip("mypy")
    modules: dict[str, Block] = {}
    for block in PYTHON_BLOCKS:
        module = re.sub(r"\W", "_", block.id)
        modules[module] = block
        (tmp_path / f"{module}.py").write_text(block.source, encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", "--no-error-summary",
         "--cache-dir", str(ROOT / ".mypy_cache" / "docs-examples"), "."],
        cwd=tmp_path, env={**os.environ, "MYPYPATH": str(ROOT)}, capture_output=True,
        text=True, timeout=TIMEOUT_S * 2, check=False,
    )

    def where(match: re.Match[str]) -> str:  # example.py:N -> docs/page.md:line
        block = modules[match.group(1)]
        return f"{block.page.relative_to(ROOT).as_posix()}:{block.line + int(match.group(2))}:"

    report = re.sub(r"^(\w+)\.py:(\d+):", where, done.stdout, flags=re.MULTILINE)
    assert done.returncode == 0, f"mypy --strict on the examples:\n{report}{done.stderr}"


def imports_the_test_suite(source: str) -> bool:
    """Whether `source` imports the `tests` package, which ships only in the checkout."""
    return _IMPORTS_TESTS.search(source) is not None


def test_no_example_imports_the_test_suite() -> None:
    """A reader has the installed packages, not pulse's tests: stand-ins an example needs
    ship in the package (e.g. pulse_adapters.llm.stand_in)."""
    assert imports_the_test_suite("from tests.adapters.chat_server import ChatServer\n")
    assert imports_the_test_suite("import os, tests\n")
    assert not imports_the_test_suite("from pulse_adapters.llm.stand_in import ChatServer\n")
    wrong = [b.id for b in PYTHON_BLOCKS if imports_the_test_suite(b.source)]
    assert not wrong, f"examples importing `tests`, which a reader does not have: {wrong}"


def installed_only_path() -> str:
    """PYTHONPATH without the checkout: an example finds pulse as an installed package."""
    keep = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if entry and Path(entry).resolve() != ROOT]
    return os.pathsep.join(keep)


def servers_for(block: Block, request: pytest.FixtureRequest) -> dict[str, str]:
    """The servers an example names by environment variable, as a reader's deployment has
    them: PULSE_POSTGRES_URL (a new empty database of a real PostgreSQL on loopback) and
    PULSE_REDIS_URL (a real redis-server on loopback)."""
    env: dict[str, str] = {}
    if "PULSE_POSTGRES_URL" in block.source:
        env["PULSE_POSTGRES_URL"] = request.getfixturevalue("postgres_server").create_database()
    if "PULSE_REDIS_URL" in block.source:
        env["PULSE_REDIS_URL"] = request.getfixturevalue("redis_server").url()
    return env


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.id for b in PYTHON_BLOCKS])
def test_python_block_runs(block: Block, tmp_path: Path, request: pytest.FixtureRequest
                           ) -> None:
    home = tmp_path / "home"
    home.mkdir()
    script = tmp_path / "example.py"
    script.write_text(block.source, encoding="utf-8")
    env = {
        **os.environ,
        "HOME": str(home),
        "UPULSE_HOME": str(home / ".upulse"),
        "PYTHONPATH": installed_only_path(),
        "PYTHONDONTWRITEBYTECODE": "1",
        **servers_for(block, request),
    }
    try:
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
            text=True, timeout=TIMEOUT_S, check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(
            f"{block.id} ran longer than {TIMEOUT_S} s\n"
            f"--- stdout ---\n{exc.stdout or ''}\n--- stderr ---\n{exc.stderr or ''}"
        )
    assert done.returncode == 0, (
        f"{block.id} exited with {done.returncode}\n"
        f"--- stdout ---\n{done.stdout}\n--- stderr ---\n{done.stderr}"
    )
