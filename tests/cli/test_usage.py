"""`upulse` on any home, usage errors that say what was meant, --version, completion, --json."""

from __future__ import annotations

import argparse
import asyncio
import importlib.metadata
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pulse_cli.main import build_parser, main
from pulse_core import Engine, EventDraft, VitalsStore, register_kind
from tests.cli.runner import Upulse

READ_ONLY = (["events"], ["effects"], ["tasks"], ["vitals"], ["vitals", "load"], ["tick"],
             ["memory", "list"], ["metrics"])


def embedded_home(home: Path) -> Path:
    """A home an embedded `pulse_core.Engine` wrote (no config.json, no engine directory),
    with a notification, a task and a vitals key `load`."""

    async def run() -> None:
        engine = Engine(home)
        await engine.open()
        try:
            await engine.step()
            await engine.events.append([
                EventDraft("notification", "demo", {"text": "hello"}, origin="human"),
                EventDraft("task-created", "t-1", {"title": "embedded"}, origin="agent")])
        finally:
            await engine.close()
        vitals = await VitalsStore.open(home / "vitals.db")
        try:
            await vitals.record("load", {"per_core": 0.5})
        finally:
            await vitals.close()

    asyncio.run(run())
    return home


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    """`upulse ARGV` in this process: (exit code, stdout, stderr)."""
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


# -- item 2: every read-only command reads any home with an events.db ----------------------


def test_read_only_commands_read_a_home_an_embedded_engine_made(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = embedded_home(tmp_path / "home")
    for command in READ_ONLY:
        code, out, err = run(capsys, *command, "--home", home)
        assert code == 0, (command, err)
        assert "init" not in err, (command, err)
    code, out, _ = run(capsys, "events", "--json", "--home", home)
    kinds = [e["kind"] for e in json.loads(out)]
    assert kinds[0] == "engine-started" and "notification" in kinds
    code, out, _ = run(capsys, "tasks", "--json", "--home", home)
    assert [t["id"] for t in json.loads(out)] == ["t-1"]
    code, out, err = run(capsys, "daemon", "status", "--home", home)
    assert code == 3 and "is not running" in err and "init" not in err + out
    assert "pending   0 effects" in out
    assert not (home / "config.json").exists() and not (home / "engine").exists()


def test_commands_that_need_an_engine_directory_say_what_init_adds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = embedded_home(tmp_path / "home")
    for command in (["promote"], ["rollback"], ["deploy"], ["dev"], ["daemon", "start"]):
        code, _, err = run(capsys, *command, "--home", home)
        assert code == 1, (command, err)
        assert f"`upulse init --home {home}` adds config.json, engine/" in err, (command, err)
        assert "keeps events.db" in err, (command, err)
    assert not (home / "config.json").exists()


def test_a_folder_without_an_event_log_is_refused_without_suggesting_init(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    for command in READ_ONLY:
        code, _, err = run(capsys, *command, "--home", empty)
        assert code == 1, (command, err)
        assert f"{empty} is not a pulse home: it has no events.db" in err
        assert "init" not in err, err
    assert list(empty.iterdir()) == []


# -- item 6: unknown values are usage errors with "did you mean" ---------------------------


def test_an_unknown_event_kind_is_a_usage_error_that_names_the_nearest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = embedded_home(tmp_path / "home")
    code, _, err = run(capsys, "events", "--kind", "notifcation", "--home", home)
    assert code == 2
    assert "usage: upulse events" in err
    assert ("no event kind 'notifcation' in the catalogue or the log — did you mean "
            "'notification'?") in err
    code, _, _ = run(capsys, "events", "--kind", "rollback", "--home", home)
    assert code == 0  # in the catalogue, not yet in this log


async def test_a_kind_only_the_log_knows_is_accepted_and_suggested(
        upulse: Upulse, tmp_path: Path) -> None:
    register_kind("probe-reading", "a kind of an engine's own code, unknown to the CLI")
    home = await asyncio.to_thread(embedded_home, tmp_path / "home")
    engine = Engine(home)
    await engine.open()
    try:
        await engine.events.append([EventDraft("probe-reading", "p", {"n": 1})])
    finally:
        await engine.close()
    found = upulse.json("events", "--kind", "probe-reading", "--home", home)
    assert [e["key"] for e in found] == ["p"]  # type: ignore[union-attr]
    typo = upulse("events", "--kind", "probe-readng", "--home", home, ok=False)
    assert typo.returncode == 2 and "did you mean 'probe-reading'?" in typo.stderr


def test_following_a_kind_not_seen_yet_warns_and_waits_for_its_first_event(
        upulse: Upulse, tmp_path: Path) -> None:
    """`--follow` for a kind an engine's code registers but has not written yet was a usage
    error: the first event of a new kind is what one follows for."""
    register_kind("probe-first", "a kind whose first event is awaited")
    home = embedded_home(tmp_path / "home")
    argv = [sys.executable, "-m", "pulse_cli", "events", "--kind", "probe-first", "--follow",
            "--json", "--home", str(home)]
    follower = subprocess.Popen(argv, env=upulse.env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        assert follower.stderr is not None and follower.stdout is not None
        warning = follower.stderr.readline()
        assert "no event kind 'probe-first'" in warning and "following for it" in warning
        asyncio.run(_append_one(home, EventDraft("probe-first", "p", {"n": 1})))
        assert json.loads(follower.stdout.readline())["kind"] == "probe-first"
    finally:
        follower.kill()
        follower.communicate()


async def _append_one(home: Path, draft: EventDraft) -> None:
    engine = Engine(home)
    await engine.open()
    try:
        await engine.events.append([draft])
    finally:
        await engine.close()


def test_an_unknown_task_status_or_vitals_key_is_a_usage_error_that_names_the_nearest(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = embedded_home(tmp_path / "home")
    code, _, err = run(capsys, "tasks", "--status", "pendng", "--home", home)
    assert code == 2 and "usage: upulse tasks" in err and "did you mean 'pending'?" in err
    code, out, _ = run(capsys, "tasks", "--status", "given-up", "--home", home)
    assert code == 0 and "no tasks" in out
    code, _, err = run(capsys, "vitals", "lod", "--home", home)
    assert code == 2 and "usage: upulse vitals" in err
    assert "no vitals key 'lod' in this home — did you mean 'load'?" in err


@pytest.mark.parametrize("argv", [
    ["events", "--limit", "-5"], ["effects", "--limit", "-1"], ["vitals", "--limit", "-1"],
    ["daemon", "logs", "-n", "-3"], ["daemon", "stop", "--timeout", "0"],
    ["deploy", "--timeout", "-1"], ["dev", "--seconds", "0"], ["vitals", "--since", "0s"],
])
def test_a_negative_or_meaningless_count_is_a_usage_error(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2, err
    assert f"usage: upulse {' '.join(a for a in argv[:2] if not a.startswith('-'))}" in err


def test_a_mistyped_option_prints_the_usage_of_its_command_and_the_nearest_option(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "events", "--knd", "task-created")
    assert code == 2
    assert err.startswith("usage: upulse events")
    assert "unrecognized arguments: --knd task-created — did you mean --kind?" in err
    code, _, err = run(capsys, "daemon", "stop", "--timout", "3")
    assert code == 2 and err.startswith("usage: upulse daemon stop") and "--timeout?" in err
    code, _, err = run(capsys, "evnts")
    assert code == 2 and "did you mean 'events'?" in err


# -- item 5: errors say what was wrong and what to do, without class names -----------------


def test_creating_a_task_that_exists_says_how_to_move_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = embedded_home(tmp_path / "home")
    code, _, err = run(capsys, "task", "create", "t-1", "--title", "again", "--home", home)
    assert code == 1
    assert err == ("upulse task create: task t-1 exists (status pending) — use `upulse task "
                   "assign|start|ack|close|give-up t-1` to move it, or pick another id\n")
    code, _, err = run(capsys, "task", "close", "t-1", "--home", home)
    assert code == 1
    assert err.startswith("upulse task close: task-closed needs task 't-1' to be acked; "
                          "it is pending — ")
    assert "InvalidTransition" not in err and "Error:" not in err


# -- item 10: --version, completion, help on every argument, --json ------------------------


def test_version_is_the_installed_distributions(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out == f"upulse {importlib.metadata.version('upulse')}\n"


def walk(parser: argparse.ArgumentParser, path: str = "upulse"
         ) -> list[tuple[str, argparse.Action]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += walk(sub, f"{path} {name}")
        else:
            found.append((path, action))
    return found


def test_every_argument_of_every_command_has_help_text() -> None:
    missing = [f"{path} {action.dest}" for path, action in walk(build_parser())
               if not action.help]
    assert missing == []


def complete(script: str, line: str) -> list[str]:
    """What bash completes for `line` (the last word is the one being completed)."""
    words = line.split(" ")
    quoted = [shlex.quote(w) for w in words]
    probe = (f"{script}\nCOMP_WORDS=({' '.join(quoted)})\nCOMP_CWORD={len(words) - 1}\n"
             f"_upulse upulse {quoted[-1]} {quoted[-2]}\n"
             "printf '%s\\n' \"${COMPREPLY[@]}\"\n")
    done = subprocess.run(["bash", "--norc", "--noprofile"], input=probe, text=True,
                          capture_output=True, check=True, timeout=10)
    return sorted(done.stdout.split())


def test_completion_scripts_complete_commands_options_and_their_values(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, bash, _ = run(capsys, "completion", "bash")
    assert code == 0 and "complete -F _upulse upulse" in bash
    assert complete(bash, "upulse da") == ["daemon"]
    assert complete(bash, "upulse daemon st") == ["start", "status", "stop"]
    assert complete(bash, "upulse --home /tmp daemon stop --") == [
        "--help", "--home", "--instance", "--json", "--timeout"]
    assert complete(bash, "upulse tasks --status ") == [
        "acked", "assigned", "closed", "executing", "given-up", "pending"]
    assert "notification" in complete(bash, "upulse events --kind no")
    assert complete(bash, "upulse task create t-1 --title ") == []
    code, zsh, _ = run(capsys, "completion", "zsh")
    assert code == 0 and 'eval "$(upulse completion zsh)"' in zsh and "bashcompinit" in zsh
    shimmed = "autoload() { :; }\ncompinit() { :; }\nbashcompinit() { :; }\n" + zsh
    assert complete(shimmed, "upulse daemon st") == ["start", "status", "stop"]


def test_init_json_says_what_it_created(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    code, out, _ = run(capsys, "init", "--json", "--home", home)
    first = json.loads(out)
    assert code == 0 and first["home"] == str(home) and first["instance"] == "home"
    assert "config.json" in first["created"] and "events.db" in first["created"]
    code, out, _ = run(capsys, "init", "--json", "--home", home)
    assert json.loads(out) == {"home": str(home), "instance": "home", "host": first["host"],
                               "created": []}


@pytest.mark.parametrize(("argv", "target"), [
    (["rollback", "--json"], "release.rollback"), (["deploy", "--json"], "release.deploy"),
    (["dev", "--json"], "release.dev"), (["doctor", "--json"], "doctor.doctor"),
])
def test_rollback_deploy_dev_and_doctor_take_json(argv: list[str], target: str,
                                                  tmp_path: Path) -> None:
    from pulse_cli.home import Home

    args = build_parser().parse_args(argv)
    assert args.target == target
    assert args.arguments(args, Home(tmp_path))["as_json"] is True
