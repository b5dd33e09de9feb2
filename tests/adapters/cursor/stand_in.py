"""The stand-in `agent` executable as the cursor tests drive it: written into the test's
folder with the test interpreter as its shebang, told how to behave through a file beside it,
and read back through the record it keeps of each run."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SOURCE = Path(__file__).with_name("stand_in_agent.py")


@dataclass(frozen=True)
class StandIn:
    """An executable `agent` in `folder` (put `folder` first on PATH, or give `program`)."""

    program: Path

    @classmethod
    def install(cls, folder: Path) -> StandIn:
        """Write the executable into `folder` (created), behaving as "success"."""
        folder.mkdir(parents=True, exist_ok=True)
        program = folder / "agent"
        program.write_text(f"#!{sys.executable}\n{SOURCE.read_text(encoding='utf-8')}",
                           encoding="utf-8")
        program.chmod(0o755)
        stand_in = cls(program)
        stand_in.behave("success")
        return stand_in

    def behave(self, mode: str, **more: Any) -> None:
        """How every run from now on behaves (see stand_in_agent.py)."""
        behaviour = {"mode": mode, **more}
        self.program.with_name("behaviour.json").write_text(json.dumps(behaviour),
                                                            encoding="utf-8")

    def runs(self) -> list[dict[str, Any]]:
        """One record per run so far: argv, cwd, pid, mode and any grandchild's pid."""
        record = self.program.with_name("record.jsonl")
        if not record.exists():
            return []
        return [json.loads(line) for line in record.read_text(encoding="utf-8").splitlines()]


def settings(stand_in: StandIn, repo: Path, **more: Any) -> dict[str, Any]:
    """The layer's object in config.json: one agent `coder` in `repo`, run by the stand-in."""
    return {"program": str(stand_in.program),
            "agents": [{"name": "coder", "projects": ["web"], "repo": str(repo)}],
            "run_timeout_s": 10.0, **more}
