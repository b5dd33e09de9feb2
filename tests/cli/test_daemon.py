"""`upulse init`, `daemon start|stop|status|logs|restart` and `instances`, with real processes."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from pulse_core import SqliteEventStore
from tests.cli.runner import Upulse, daemon_pid, wait_until
from tests.cli.support import (
    NEW_TEXT,
    OLD_TEXT,
    ROOT,
    RULE,
    configure,
    edit,
    git,
    install_probe_layer,
    promote_event,
    stage_new_text,
)
from tests.e2e.support import read_events

TEST_TIME_LIMIT_S = 90


def file_times(home: Path) -> dict[str, int]:
    return {str(p.relative_to(home)): p.stat().st_mtime_ns for p in sorted(home.rglob("*"))
            if ".git" not in p.parts}


def status_of(upulse: Upulse, home: Path) -> dict[str, object]:
    report = upulse.json("daemon", "status", "--home", home)
    assert isinstance(report, dict)
    return report


def test_init_lays_out_a_home_and_a_second_init_changes_nothing_and_says_so(
        upulse: Upulse, tmp_path: Path) -> None:
    home = tmp_path / "home"
    first = upulse("init", "--home", home)
    assert "initialised" in first.stdout
    for name in ("config.json", "events.db", "vitals.db", "objects"):
        assert (home / name).exists(), name
    before = file_times(home)
    second = upulse("init", "--home", home)
    assert second.returncode == 0
    assert "already exists; nothing changed" in second.stdout
    assert file_times(home) == before


def test_a_daemon_starts_reports_its_status_refuses_a_second_start_and_stops_cleanly(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    started = upulse("daemon", "start", "--home", home)
    pid = daemon_pid(home)
    assert pid is not None and f"pid {pid}" in started.stdout
    wait_until(lambda: status_of(upulse, home)["status"]["ticks"] >= 2,  # type: ignore[index]
               10, "the daemon to report two ticks")
    report = status_of(upulse, home)
    assert report["running"] is True and report["pid"] == pid
    assert report["pending_effects"] == 0
    human = upulse("daemon", "status", "--home", home).stdout
    assert f"running (pid {pid})" in human and "uptime" in human and "/min" in human

    again = upulse("daemon", "start", "--home", home, ok=False)
    assert again.returncode == 3
    assert f"already running (pid {pid})" in again.stderr
    assert daemon_pid(home) == pid

    upulse("task", "create", "t-1", "--title", "while the daemon runs", "--home", home)
    stopped = upulse("daemon", "stop", "--home", home)
    assert f"daemon stopped (was pid {pid})" in stopped.stdout
    assert not (home / "daemon.pid").exists()
    kinds = [e.kind for e in read_events(home / "events.db")]
    assert kinds[0] == "engine-started" and kinds[-1] == "engine-stopped"
    assert "task-created" in kinds
    after = upulse("daemon", "status", "--home", home, ok=False)
    assert after.returncode == 3 and "not running" in after.stderr
    assert "stopped" in after.stdout
    assert "ready" in upulse("daemon", "logs", "--home", home).stdout


def test_a_daemon_starting_after_a_promote_that_never_moved_main_records_what_runs(
        upulse: Upulse, tmp_path: Path) -> None:
    """Issue 14, item 14: a promote recorded just before its process died (main never moved)
    made the log say a revision ran that never did; the daemon sets it right at start."""
    home = upulse.init(tmp_path / "home")
    main = git(home / "engine", "rev-parse", "HEAD")

    async def recorded_promote() -> None:
        store = await SqliteEventStore.open(home / "events.db")
        try:
            await store.append([promote_event("0" * 40, main)])
        finally:
            await store.close()

    asyncio.run(recorded_promote())
    upulse("daemon", "start", "--home", home)
    upulse("daemon", "stop", "--home", home)
    [rollback] = read_events(home / "events.db", {"rollback"})
    assert rollback.data["revision"] == main
    assert "was recorded but main never moved" in rollback.data["reason"]


def test_stop_when_no_daemon_runs_exits_3(upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    done = upulse("daemon", "stop", "--home", home, ok=False)
    assert done.returncode == 3
    assert "not running" in done.stderr


def test_two_instances_run_side_by_side_with_their_own_pids_and_databases(
        upulse: Upulse) -> None:
    for name in ("blue", "green"):
        upulse("init", "--instance", name)
        upulse("daemon", "start", "--instance", name)
    blue, green = (upulse.base / "instances" / n for n in ("blue", "green"))
    assert daemon_pid(blue) is not None and daemon_pid(green) is not None
    assert daemon_pid(blue) != daemon_pid(green)
    blue_started = read_events(blue / "events.db", {"engine-started"})
    green_started = read_events(green / "events.db", {"engine-started"})
    assert [e.data["pid"] for e in blue_started] == [daemon_pid(blue)]
    assert [e.data["pid"] for e in green_started] == [daemon_pid(green)]

    listed = upulse.json("instances")
    assert isinstance(listed, list)
    by_name = {i["name"]: i for i in listed}
    assert by_name["blue"]["state"] == "running" and by_name["blue"]["pid"] == daemon_pid(blue)
    assert by_name["green"]["pid"] == daemon_pid(green)
    assert by_name["default"]["state"] == "not initialised"
    assert "blue" in upulse("instances").stdout

    upulse("daemon", "stop", "--instance", "blue")
    assert daemon_pid(blue) is None and daemon_pid(green) is not None
    text = upulse("instances").stdout
    assert "stopped" in text and f"running (pid {daemon_pid(green)})" in text


def test_sighup_reloads_the_rules_and_code_that_fails_to_load_keeps_the_old_rules_running(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    upulse("daemon", "start", "--home", home)
    pid = daemon_pid(home)
    assert pid is not None
    head = head_of(home / "engine")
    assert status_of(upulse, home)["status"]["revision"] == head  # type: ignore[index]

    entry = home / "engine" / "engine.py"
    good = entry.read_text()
    entry.write_text(good + "\ndef broken(:\n")
    git(home / "engine", "commit", "-qam", "broken")  # production runs commits only
    os.kill(pid, signal.SIGHUP)
    wait_until(lambda: status_of(upulse, home)["status"]["reloads"] == 1,  # type: ignore[index]
               10, "the daemon to report a reload")
    assert daemon_pid(home) == pid
    failures = read_events(home / "events.db", {"error"})
    assert [e.key for e in failures] == ["engine:reload"]
    assert "SyntaxError" in failures[0].data["type"]
    assert "reload failed, the previous engine keeps running" in (home / "daemon.log").read_text()
    last_errors = status_of(upulse, home)["last_errors"]
    assert [e["key"] for e in last_errors] == ["engine:reload"]  # type: ignore[attr-defined]

    entry.write_text(good)
    git(home / "engine", "commit", "-qam", "fixed")
    upulse("daemon", "restart", "--home", home)
    assert daemon_pid(home) not in (None, pid)
    fixed = head_of(home / "engine")
    assert fixed != head
    assert status_of(upulse, home)["status"]["revision"] == fixed  # type: ignore[index]


def test_a_daemon_whose_engine_code_does_not_load_still_runs_the_survival_layer(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    (home / "engine" / "engine.py").write_text("def broken(:\n")
    git(home / "engine", "commit", "-qam", "broken")  # production runs commits only
    upulse("daemon", "start", "--home", home)
    report = status_of(upulse, home)
    assert report["running"] is True
    assert report["status"]["revision"] is None  # type: ignore[index]
    failures = read_events(home / "events.db", {"error"})
    assert [(e.key, e.data["type"]) for e in failures] == [("engine:load", "SyntaxError")]
    assert "survival rules only" in (home / "daemon.log").read_text()


def test_foreground_runs_the_daemon_in_the_calling_process_until_sigterm(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    log = (tmp_path / "foreground.log").open("wb")
    with log:
        child = subprocess.Popen(
            [sys.executable, "-m", "pulse_cli", "daemon", "start", "--foreground", "--home",
             str(home)], env=upulse.env, stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_until(lambda: daemon_pid(home) == child.pid, 15, "the foreground daemon")
            child.send_signal(signal.SIGTERM)
            assert child.wait(timeout=15) == 0
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    assert not (home / "daemon.pid").exists()
    output = (tmp_path / "foreground.log").read_text()
    assert "ready" in output and "stopped" in output
    status = json.loads((home / "daemon.status.json").read_text())
    assert status["state"] == "stopped" and status["pid"] == child.pid


def head_of(repo: Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_deploy_makes_the_daemon_run_the_promoted_revision_and_rollback_takes_it_back(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    upulse("daemon", "start", "--home", home)
    first = head_of(home / "engine")
    stage_new_text(home / "staging")
    deployed = upulse("deploy", "--home", home, "--timeout", "20")
    promoted = head_of(home / "engine")
    assert promoted != first
    assert f"deployed: the daemon runs revision {promoted}" in deployed.stdout
    assert status_of(upulse, home)["status"]["revision"] == promoted  # type: ignore[index]
    assert NEW_TEXT in (home / "engine" / RULE).read_text()
    notes = home / "notes.md"
    inbox = home / "inbox"
    inbox.mkdir(exist_ok=True)
    (inbox / "first.txt").write_text("hello")  # the running daemon now runs the new rule
    wait_until(lambda: notes.exists() and NEW_TEXT in notes.read_text(), 20,
               "the promoted rule to write its note")

    rolled = upulse("rollback", "--home", home, "--reason", "the test says so")
    reverted = head_of(home / "engine")
    assert f"rolled back: main is at {reverted}" in rolled.stdout
    wait_until(lambda: status_of(upulse, home)["status"]["revision"]  # type: ignore[index]
               == reverted, 10, "the daemon to reload the rolled-back revision")
    assert OLD_TEXT in (home / "engine" / RULE).read_text()
    (inbox / "second.txt").write_text("hello again")  # and the old rule runs again
    wait_until(lambda: f"2 {OLD_TEXT}" in notes.read_text(), 20,
               "the rolled-back rule to write its note")
    records = read_events(home / "events.db", {"promote", "rollback"})
    assert [(e.kind, e.data["revision"]) for e in records] == [
        ("promote", promoted), ("rollback", reverted)]
    assert records[1].data["reason"] == "the test says so"


def test_a_promote_the_gate_refuses_exits_4_names_the_step_and_changes_nothing(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    before = head_of(home / "engine")
    (home / "staging" / RULE).write_text("def broken(:\n")
    done = upulse("promote", "--home", home, ok=False)
    assert done.returncode == 4
    assert "promote refused: the compile step failed" in done.stdout
    assert "rules/inbox.py:1" in done.stdout
    assert head_of(home / "engine") == before
    assert read_events(home / "events.db", {"promote"}) == []


# -- layers from config.json, and whole reloads ------------------------------------------------


def with_probe_layer(upulse: Upulse, tmp_path: Path) -> None:
    """Make the `probe` layer (tests.cli.support.PROBE_LAYER) installed for `upulse`."""
    site = install_probe_layer(tmp_path / "site")
    upulse.env["PYTHONPATH"] = os.pathsep.join([str(site), upulse.env["PYTHONPATH"]])


def probe_tag(upulse: Upulse, home: Path) -> object:
    latest = upulse.json("vitals", "--home", home)
    assert isinstance(latest, list)
    return next((s["data"]["tag"] for s in latest if s["key"] == "probe"), None)


def test_a_configured_layer_runs_and_sighup_after_editing_config_json_rebuilds_it(
        upulse: Upulse, tmp_path: Path) -> None:
    with_probe_layer(upulse, tmp_path)
    home = upulse.init(tmp_path / "home")
    configure(home, layers={"probe": {"tag": "one"}})
    upulse("daemon", "start", "--home", home)
    pid = daemon_pid(home)
    assert pid is not None
    wait_until(lambda: probe_tag(upulse, home) == "one", 10, "the probe layer's watcher")

    configure(home, layers={"probe": {"tag": "two"}})
    os.kill(pid, signal.SIGHUP)
    wait_until(lambda: probe_tag(upulse, home) == "two", 15,
               "the reloaded layer to report its new settings")
    assert daemon_pid(home) == pid
    lifecycle = [e.kind for e in read_events(home / "events.db",
                                             {"engine-started", "engine-stopped"})]
    assert lifecycle == ["engine-started", "engine-stopped", "engine-started"]
    assert "SIGHUP: reloaded" in (home / "daemon.log").read_text()

    (home / "config.json").write_text('{"layers": {"probe": {"tag": 2}}}')
    os.kill(pid, signal.SIGHUP)
    wait_until(lambda: status_of(upulse, home)["status"]["reloads"] == 2,  # type: ignore[index]
               10, "the daemon to report the second reload")
    failures = read_events(home / "events.db", {"error"})
    assert [(e.key, e.data["type"]) for e in failures] == [("engine:reload", "BrokenLayer")]
    assert "layer 'probe' refused its settings" in failures[0].data["message"]
    assert daemon_pid(home) == pid and status_of(upulse, home)["running"] is True
    assert [e.kind for e in read_events(home / "events.db", {"engine-started"})] == [
        "engine-started", "engine-started"]  # the running engine was left alone


def test_a_daemon_refuses_to_start_when_a_configured_layer_is_missing_or_refuses_settings(
        upulse: Upulse, tmp_path: Path) -> None:
    with_probe_layer(upulse, tmp_path)
    home = upulse.init(tmp_path / "home")
    configure(home, layers={"no-such-layer": {}})
    done = upulse("daemon", "start", "--home", home, ok=False)
    assert done.returncode == 1
    assert f"{home / 'config.json'}: layers: no layer named 'no-such-layer' is installed" in \
        done.stderr
    assert "probe" in done.stderr  # the installed layers are listed

    configure(home, layers={"probe": {"tag": 5}})
    for foreground in ([], ["--foreground"]):
        done = upulse("daemon", "start", *foreground, "--home", home, ok=False)
        assert done.returncode == 1
        assert "layers: layer 'probe' refused its settings: ValidationError" in done.stderr
        assert "$.tag" in done.stderr
    assert not (home / "daemon.pid").exists()
    assert read_events(home / "events.db") == []


PING = '''"""Ping: a new effect, its executor, and the rule that emits it (one promote)."""

from __future__ import annotations

from pulse_core import Decision, Effect, ExecutionContext, Executor, Inner, Snapshot, emits

from .inbox import inbox_count


class Ping(Effect, tag="ping"):
    """How many messages wait."""

    count: int


class PingExecutor(Executor):
    """Answers each Ping."""

    handles = (Ping,)

    async def execute(self, effect: Ping, ctx: ExecutionContext) -> dict[str, int]:
        return {"pong": effect.count}


@emits(Ping)
async def ping_on_mail(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    """A Ping whenever the inbox grew since the last tick."""
    effects, tick_ms = await inner(prev, curr)
    count = inbox_count(curr)
    if count > inbox_count(prev):
        effects = [*effects, Ping(count=count)]
    return Decision(effects, tick_ms)
'''


def test_a_promote_that_adds_a_rule_and_its_executor_reloads_both_and_the_effect_is_acked(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    upulse("daemon", "start", "--home", home)
    staging = home / "staging"
    (staging / "rules" / "ping.py").write_text(PING)
    edit(staging / "engine.py", "from .rules.inbox import inbox_note\n",
         "from .rules.inbox import inbox_note\nfrom .rules.ping import PingExecutor, "
         "ping_on_mail\n")
    edit(staging / "engine.py", "rules=[inbox_note],", "rules=[inbox_note, ping_on_mail],")
    edit(staging / "engine.py", 'executors=[NoteExecutor(context.home / paths.notes)],',
         'executors=[NoteExecutor(context.home / paths.notes), PingExecutor()],')
    upulse("deploy", "--home", home, "--timeout", "30", timeout=120)
    (home / "inbox").mkdir(exist_ok=True)
    (home / "inbox" / "first.txt").write_text("hello")

    def ping_finished() -> list[str]:
        pings = {e.key for e in read_events(home / "events.db", {"effect"})
                 if e.data["effect"]["type"] == "ping"}
        return [e.kind for e in read_events(home / "events.db", {"effect-acked", "effect-failed"})
                if e.key in pings]

    outcome = wait_until(ping_finished, 20, "the promoted rule's Ping to finish")
    assert outcome == ["effect-acked"], read_events(home / "events.db", {"effect-failed"})
    (acked,) = [e for e in read_events(home / "events.db", {"effect-acked"})
                if e.data["result"] == {"pong": 1}]
    assert acked.data["attempt"] == 1


# -- the ./dev script: the README's set-up commands ------------------------------------------

STUB_PYTHON = """#!/bin/sh
# The venv's python, except that `-m pip` only records what it was asked to install.
if [ "$1" = -m ] && [ "$2" = pip ]; then echo "$*" >> "$(dirname "$0")/../pip.log"; exit 0; fi
exec {python} "$@"
"""


def stub_venv(venv: Path, *, installed: str | None) -> Path:
    """A PULSE_VENV for ./dev whose python and upulse are this checkout's (pip does nothing,
    ruff and mypy only say they ran); `installed` names the stamp of a finished install."""
    bin_dir = venv / "bin"
    bin_dir.mkdir(parents=True)
    real = Path(sys.executable)
    scripts = {"python": STUB_PYTHON.format(python=real),
               "upulse": f'#!/bin/sh\nexec {real} -m pulse_cli "$@"\n',
               "ruff": "#!/bin/sh\necho RUFF-RAN\n", "mypy": "#!/bin/sh\necho MYPY-RAN\n"}
    for name, text in scripts.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    if installed is not None:
        (venv / f".installed-{installed}").touch()
    return venv


def dev(upulse: Upulse, venv: Path, *args: str) -> subprocess.Popen[str]:
    """`./dev ARGS` with the stub venv; stdout and stderr together, in order."""
    return subprocess.Popen([str(ROOT / "dev"), *args], env={**upulse.env, "PULSE_VENV": str(venv)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL)


def test_dev_test_says_that_it_installs_then_names_each_phase_as_it_starts(
        upulse: Upulse, tmp_path: Path) -> None:
    """Item 9: the first `./dev test` says it is installing; each phase is announced."""
    venv = stub_venv(tmp_path / "venv", installed=None)
    first, _ = dev(upulse, venv, "test", "--version").communicate(timeout=60)
    lines = [line for line in first.splitlines() if line.strip()]
    said = [n for n, line in enumerate(lines) if line.startswith("./dev: ")]
    assert [lines[n].split("…")[0] for n in said] == [
        f"./dev: installing pulse and its dependencies into {venv} (once; up to a minute)",
        "./dev: installed", "./dev: ruff check", "./dev: mypy --strict", "./dev: pytest"]
    assert lines.index("RUFF-RAN") == said[2] + 1 and lines.index("MYPY-RAN") == said[3] + 1
    assert lines[said[4] + 1].startswith("pytest "), first
    assert "-e .[test]" in (venv / "pip.log").read_text()
    again, _ = dev(upulse, venv, "test", "--version").communicate(timeout=60)
    assert "installing" not in again and "./dev: pytest…" in again


def test_dev_demo_runs_on_its_own_instance_never_the_daemons_default_home(
        upulse: Upulse, tmp_path: Path) -> None:
    """Items 8 and 9: `./dev demo` says it is installing the first time, then runs on
    $UPULSE_HOME/instances/demo and leaves the default home alone."""
    venv = stub_venv(tmp_path / "venv", installed=None)
    out, _ = dev(upulse, venv, "demo", "--seconds", "1").communicate(timeout=60)
    assert "./dev: installing pulse" in out, out
    demo = upulse.base / "instances" / "demo"
    assert f"pulse demo engine on {demo}" in out and "Traceback" not in out
    assert {e.kind for e in read_events(demo / "events.db", {"engine-started",
                                                             "engine-stopped"})} == {
        "engine-started", "engine-stopped"}
    assert not (upulse.base / "events.db").exists()


def test_dev_run_initialises_the_default_home_and_runs_its_daemon_until_ctrl_c(
        upulse: Upulse, tmp_path: Path) -> None:
    """Item 15: `./dev run` lays out the default home when it is new and runs its daemon in
    the foreground (survival layer, the template engine); Ctrl-C drains and exits 0."""
    venv = stub_venv(tmp_path / "venv", installed="run")
    upulse.homes.append(upulse.base)
    child = dev(upulse, venv, "run")
    try:
        wait_until(lambda: daemon_pid(upulse.base) == child.pid, 30, "the daemon of ./dev run")
        child.send_signal(signal.SIGINT)
        out, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert child.returncode == 0, out
    assert f"initialised {upulse.base}" in out and "Traceback" not in out
    assert f"ready: home {upulse.base}" in out and "stopped" in out
    assert f"default tick 5000 ms (from {upulse.base / 'config.json'})" in out
    assert (upulse.base / "engine" / "engine.py").is_file()
    stopped = read_events(upulse.base / "events.db", {"engine-stopped"})
    assert [e.data["pid"] for e in stopped] == [child.pid]


LIFESPAN_CODE = '''

import contextlib as _contextlib
from collections.abc import AsyncIterator as _AsyncIterator

_built_layer = layer


def layer(settings: Any, context: LayerContext) -> Layer:  # type: ignore[no-redef]
    """The template's layer, with a lifespan that writes its opening and closing down."""
    journal = context.home / "lifespan.log"

    @_contextlib.asynccontextmanager
    async def lifespan(engine: Any) -> _AsyncIterator[None]:
        with journal.open("a") as out:
            out.write(f"open {engine.rule_names[-1]}\\n")
        try:
            yield
        finally:
            with journal.open("a") as out:
                out.write("close\\n")

    built = _built_layer(settings, context)
    return Layer(built.name, rules=built.rules, watchers=built.watchers,
                 executors=built.executors, lifespan=lifespan)
'''


def test_sighup_closes_the_engine_directory_layers_lifespan_and_opens_the_new_ones(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    entry = home / "engine" / "engine.py"
    entry.write_text(entry.read_text() + LIFESPAN_CODE)
    git(home / "engine", "commit", "-qam", "a lifespan")
    journal = home / "lifespan.log"
    upulse("daemon", "start", "--home", home)
    pid = daemon_pid(home)
    assert pid is not None
    wait_until(lambda: journal.exists() and journal.read_text() == "open inbox_note\n", 10,
               "the layer's lifespan to open")
    os.kill(pid, signal.SIGHUP)
    wait_until(lambda: journal.read_text() == "open inbox_note\nclose\nopen inbox_note\n",
               10, "the old engine's lifespan to close and the new one's to open")
    upulse("daemon", "stop", "--home", home)
    assert journal.read_text().splitlines() == ["open inbox_note", "close", "open inbox_note",
                                                "close"]
