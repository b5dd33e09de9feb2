"""Every ```python block in README.md and docs/*.md is a complete program, and it runs.

Each block runs as its own pytest case, in a subprocess, in a fresh temporary directory with
HOME and UPULSE_HOME pointed inside it, so an example can never touch the reader's real home.
Shell commands and output belong in ```bash or ```text fences, which are not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
RUNNABLE = "python"
NOT_RUN = {"bash", "text"}
TIMEOUT_S = 60

_FENCE = re.compile(r"^```(\S*)\s*$")


class Block:
    """One fenced code block: its language, where it starts, and its source."""

    def __init__(self, page: Path, line: int, lang: str, source: str) -> None:
        self.page = page
        self.line = line
        self.lang = lang
        self.source = source

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
    assert not wrong, f"use ```python (runs), ```bash or ```text (does not run): {wrong}"


def test_every_docs_page_has_a_runnable_example() -> None:
    pages = {b.page for b in PYTHON_BLOCKS}
    missing = [p.name for p in PAGES if p.name != "index.md" and p not in pages]
    assert not missing, f"pages without a ```python example: {missing}"


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=[b.id for b in PYTHON_BLOCKS])
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    script = tmp_path / "example.py"
    script.write_text(block.source, encoding="utf-8")
    env = {
        **os.environ,
        "HOME": str(home),
        "UPULSE_HOME": str(home / ".upulse"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    try:
        done = subprocess.run(
            [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
            text=True, timeout=TIMEOUT_S, check=False,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{block.id} ran longer than {TIMEOUT_S} s\nstderr:\n{exc.stderr!r}")
    assert done.returncode == 0, (
        f"{block.id} exited with {done.returncode}\n"
        f"--- stdout ---\n{done.stdout}\n--- stderr ---\n{done.stderr}"
    )
