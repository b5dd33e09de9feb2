"""The shallow-autonomic tier end to end: a promoted rule that misbehaves in production is
rolled back by the survival layer, with real git and a real daemon process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.cli.runner import Upulse, wait_until
from tests.cli.support import RULE, edit
from tests.e2e.support import read_events

TEST_TIME_LIMIT_S = 90


def head_of(repo: Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_a_promoted_rule_that_raises_in_production_is_rolled_back_by_the_survival_layer(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    config = json.loads((home / "config.json").read_text())
    config["survival"] = {"rollback": {"auto_errors": 3, "auto_window_s": 60}}
    (home / "config.json").write_text(json.dumps(config))
    upulse("daemon", "start", "--home", home)
    good = head_of(home / "engine")
    # Passes the gate, then fails on every tick once the marker exists (made after the deploy:
    # a tick number would not do, since numbers carry on from the live home and a slow gate
    # lets the daemon tick past any fixed one before the dry run copies it).
    broken = tmp_path / "broken-in-production"
    edit(home / "staging" / RULE, '    effects, tick_ms = await inner(prev, curr)\n',
         '    effects, tick_ms = await inner(prev, curr)\n'
         '    import pathlib\n'
         f'    if pathlib.Path({str(broken)!r}).exists():\n'
         '        raise RuntimeError("the promoted rule broke in production")\n')
    upulse("deploy", "--home", home, "--timeout", "30", timeout=120)
    broken.touch()
    bad = head_of(home / "engine")
    assert bad != good

    def rolled_back() -> bool:
        return bool(read_events(home / "events.db", {"rollback"}))

    wait_until(rolled_back, 40, "the survival layer to roll the promotion back")
    (rollback,) = read_events(home / "events.db", {"rollback"})
    assert "errors within 60 s of promoting" in rollback.data["reason"]
    assert rollback.origin == "survival"
    kept = rollback.data["kept"]  # the rolled-back code stays on the branch the event names
    assert kept.startswith("rolled-back/") and kept.endswith("-" + bad[:12])
    assert subprocess.run(["git", "rev-parse", kept], cwd=home / "engine", check=True,
                          capture_output=True, text=True).stdout.strip() == bad
    errors = [e for e in read_events(home / "events.db", {"error"})
              if "broke in production" in e.data["message"]]
    assert len(errors) >= 3
    reverted = head_of(home / "engine")
    assert reverted not in (good, bad)
    assert "broke in production" not in (home / "engine" / RULE).read_text()
    log = subprocess.run(["git", "log", "--format=%s", "-3"], cwd=home / "engine", check=True,
                         capture_output=True, text=True).stdout
    assert log.startswith("Revert to ")  # a new commit: history is kept, never rewritten
    def daemon_runs_the_rollback() -> bool:
        report = json.loads(upulse("daemon", "status", "--home", home, "--json").stdout)
        return bool(report["status"]["revision"] == reverted)

    wait_until(daemon_runs_the_rollback, 15, "the daemon to reload the rolled-back revision")
    acked = [e for e in read_events(home / "events.db", {"effect"})
             if e.data["effect"]["type"] == "rollback"]
    assert len(acked) == 1
