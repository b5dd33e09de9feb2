"""The agent hosts the adapter tests need: a failed install is a test failure that says why."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import agent_programs


def test_a_failed_install_fails_the_test_with_the_recorded_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "node").mkdir()
    (tmp_path / "node" / "node").touch()
    (tmp_path / "openclaw.failed").write_text("npm install openclaw@2026.9.6 failed:\nETIMEDOUT")
    monkeypatch.setenv("PULSE_NODE_BIN", str(tmp_path / "node"))
    monkeypatch.setenv("PULSE_OPENCLAW", str(tmp_path / "absent" / "openclaw"))
    monkeypatch.setattr(agent_programs, "CACHE", tmp_path)
    with pytest.raises(pytest.fail.Exception, match="ETIMEDOUT") as failed:
        agent_programs.openclaw_program()
    assert "openclaw is not installed" in str(failed.value)


def test_the_installed_openclaw_comes_with_node_24_first_on_its_path() -> None:
    program = agent_programs.openclaw_program()
    first = Path(program.env["PATH"].split(":")[0])
    assert (first / "node").exists() and program.argv0.name == "openclaw"
