"""`upulse` on a home whose event log is in PostgreSQL (and whose side store is in Redis):
config.json's store, side_store and host, `init --store`, every command that reads the log,
`doctor`, and what an unreachable server looks like. Real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pulse_cli.config import ConfigError, parse_config
from pulse_core import EventDraft, EventStore, TaskBoard
from pulse_core._effects import effect_draft
from pulse_core.store import open_event_store
from pulse_survival import Notify
from tests.cli.runner import Upulse, wait_until
from tests.cli.support import configure
from tests.servers import LOOPBACK, PostgresServer, RedisServer, free_port

TEST_TIME_LIMIT_S = 120  # the daemon test starts and drains a real daemon


def unreachable(db: str = "pulse") -> str:
    """A store URL with a password, of a PostgreSQL server that is not there."""
    return f"postgresql://pulse:s3cret-pw@{LOOPBACK}:{free_port()}/{db}?connect_timeout=1"


async def fill(url: str) -> None:
    """Two tasks (one assigned), an effect and a notification, appended through an
    EventStore on `url`, as another process would."""
    store: EventStore = await open_event_store(url)
    try:
        board = TaskBoard(store, origin="agent")
        await board.create("t-1", "summarise the inbox")
        await board.create("t-2", "tidy the notes")
        await board.assign("t-2", "ada")
        await store.append([effect_draft(Notify(topic="disk", level="warn", text="disk 91%"),
                                         origin="agent")])
    finally:
        await store.close()
    await note(url, "from pg")


def pg_home(upulse: Upulse, home: Path, url: str, *extra: str) -> Path:
    """`upulse init --home HOME --store URL ...`; the home's daemon is stopped at teardown."""
    upulse.homes.append(home)
    upulse("init", "--home", home, "--store", url, *extra)
    return home


def reader_role(server: PostgresServer, url: str) -> str:
    """`url` as a role that may only SELECT from the pulse schema: a command that writes
    (or creates the schema) fails there."""
    database = url.rsplit("/", 1)[1]
    server.sql("DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'reader') "
               "THEN CREATE ROLE reader LOGIN; END IF; END $$")
    server.sql("GRANT USAGE ON SCHEMA pulse TO reader; "
               "GRANT SELECT ON ALL TABLES IN SCHEMA pulse TO reader", database)
    return url.replace(f"{server.user}@", "reader@", 1)


# -- config.json ---------------------------------------------------------------------------


def test_config_takes_a_postgresql_store_a_redis_side_store_and_a_host() -> None:
    cfg = parse_config(json.dumps({
        "store": "postgresql://pulse@127.0.0.1:5432/pulse?schema=blue",
        "side_store": "redis://127.0.0.1:6379/2", "host": "box-a"}).encode())
    assert (cfg.store, cfg.side_store, cfg.host) == (
        "postgresql://pulse@127.0.0.1:5432/pulse?schema=blue", "redis://127.0.0.1:6379/2",
        "box-a")
    assert parse_config(b"{}").side_store is None and parse_config(b"{}").host is None


@pytest.mark.parametrize(("document", "expected"), [
    ({"side_store": "memcached://127.0.0.1"},
     "config.json: side_store: side-store URL 'memcached://127.0.0.1': unknown scheme "
     "'memcached', no installed store backend serves it (installed: redis://, rediss://, "
     "sqlite://, valkey://, valkeys://) — fix the URL, or install the distribution that "
     "provides a backend for it (it registers itself in entry-point group "
     "'pulse.side_stores')"),
    ({"side_store": "redis://:pw@127.0.0.1/x"},
     "config.json: side_store: side-store URL 'redis://127.0.0.1': '/x' is not a database "
     "number — write redis://127.0.0.1:6379/0"),
    ({"side_store": "sqlite://state.db"},
     "config.json: side_store: side-store URL 'sqlite://state.db': give the absolute path of "
     "a file after three slashes, as in sqlite:///home/me/.upulse/state.db"),
    ({"host": "two words"},
     "config.json: host must be a host name for this engine's claims, 1-255 printable "
     "characters without spaces, one per home (null: a name made once for this home, kept in "
     "host.id), got \"two words\""),
    ({"host": 7},
     "config.json: host must be a host name for this engine's claims, 1-255 printable "
     "characters without spaces, one per home (null: a name made once for this home, kept in "
     "host.id), got 7"),
])
def test_a_bad_side_store_or_host_is_refused_naming_the_field(document: object, expected: str
                                                               ) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(json.dumps(document).encode())
    assert str(caught.value) == expected


def test_a_bad_store_url_is_refused_without_its_password() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(json.dumps({"store": "postgresql://ada:s3cret-pw@db.example/"}).encode())
    assert str(caught.value).startswith("config.json: store: store URL 'postgresql://ada")
    assert "name the database" in str(caught.value) and "s3cret-pw" not in str(caught.value)


# -- init --store --------------------------------------------------------------------------


def test_init_with_store_lays_out_a_home_whose_log_is_in_postgresql(
        upulse: Upulse, tmp_path: Path, pg_url: str, postgres_server: PostgresServer,
        redis_server: RedisServer) -> None:
    home = tmp_path / "home"
    done = upulse("init", "--home", home, "--store", pg_url, "--side-store",
                  redis_server.url(3), "--json")
    report = json.loads(done.stdout)
    assert "events.db" not in report["created"]
    assert {"config.json", "vitals.db", "objects/", "engine/"} <= set(report["created"])
    config = json.loads((home / "config.json").read_text())
    assert (config["store"], config["side_store"]) == (pg_url, redis_server.url(3))
    assert not (home / "events.db").exists() and not (home / "state.db").exists()
    database = pg_url.rsplit("/", 1)[1]
    assert postgres_server.sql("SELECT count(*) FROM pulse.events", database) == "0"
    again = upulse("init", "--home", home, "--store", pg_url)
    assert "already exists; nothing changed; the event log is at" in again.stdout


def test_init_refuses_an_unreachable_store_in_one_line_and_lays_out_nothing(
        upulse: Upulse, tmp_path: Path) -> None:
    home = tmp_path / "home"
    done = upulse("init", "--home", home, "--store", unreachable(), ok=False)
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("upulse init: ")
    assert f"{LOOPBACK}:" in done.stderr and "refused" in done.stderr.lower()
    assert "s3cret-pw" not in done.stderr and "Traceback" not in done.stderr
    assert not home.exists()


def test_init_refuses_an_unreachable_side_store_and_another_store_for_an_existing_home(
        upulse: Upulse, tmp_path: Path, pg_url: str, redis_server: RedisServer) -> None:
    home = tmp_path / "home"
    gone = f"redis://:s3cret-pw@{LOOPBACK}:{free_port()}/0"
    done = upulse("init", "--home", home, "--store", pg_url, "--side-store", gone, ok=False)
    assert done.returncode == 1 and done.stderr.count("\n") == 1
    assert "side store" in done.stderr and "s3cret-pw" not in done.stderr
    assert not home.exists()
    upulse("init", "--home", home)
    other = upulse("init", "--home", home, "--store", pg_url, ok=False)
    assert other.returncode == 2
    assert "init never changes an existing home's settings" in other.stderr
    assert "upulse migrate --to URL --switch" in other.stderr
    assert json.loads((home / "config.json").read_text())["store"] is None


# -- every command that reads the log ------------------------------------------------------


async def test_every_reader_command_shows_what_was_appended_to_the_postgresql_log(
        upulse: Upulse, tmp_path: Path, pg_url: str, postgres_server: PostgresServer) -> None:
    home = pg_home(upulse, tmp_path / "home", pg_url)
    await fill(pg_url)
    configure(home, store=reader_role(postgres_server, pg_url))  # SELECT only: no writes
    listed = upulse.json("events", "--home", home)
    assert isinstance(listed, list)
    assert [e["kind"] for e in listed] == [
        "task-created", "task-created", "task-assigned", "effect", "notification"]
    table = upulse("events", "--home", home, "--kind", "notification").stdout
    assert "from pg" in table and "task-created" not in table
    effects = upulse.json("effects", "--home", home)
    assert isinstance(effects, list)
    assert [(e["type"], e["status"]) for e in effects] == [("notify", "pending")]
    tasks = upulse.json("tasks", "--home", home)
    assert isinstance(tasks, list)
    assert {(t["id"], t["status"]) for t in tasks} == {("t-1", "pending"), ("t-2", "assigned")}
    assert "no vitals yet" in upulse("vitals", "--home", home).stdout
    status = upulse("daemon", "status", "--home", home, "--json", ok=False)
    assert status.returncode == 3
    report = json.loads(status.stdout)
    assert report["pending_effects"] == 1 and report["store"] == pg_url.replace(
        f"{postgres_server.user}@", "reader@", 1)
    tick = upulse.json("tick", "--home", home)
    assert tick["seq"] == 5  # type: ignore[index]
    database = pg_url.rsplit("/", 1)[1]
    assert postgres_server.sql("SELECT count(*) FROM pulse.events", database) == "5"
    assert not (home / "events.db").exists()


async def test_effects_show_which_host_each_may_run_on(upulse: Upulse, tmp_path: Path,
                                                       pg_url: str) -> None:
    home = pg_home(upulse, tmp_path / "home", pg_url)
    store = await open_event_store(pg_url)
    try:
        await store.append([
            effect_draft(Notify(topic="t", level="info", text="bound"), "engine:tick",
                         host="host-a"),
            effect_draft(Notify(topic="t", level="info", text="free"), "agent")])
    finally:
        await store.close()
    listed = upulse.json("effects", "--home", home)
    assert isinstance(listed, list)
    assert [e["host"] for e in listed] == ["host-a", ""]
    table = upulse("effects", "--home", home).stdout
    assert "RUNS ON" in table.splitlines()[0]
    assert [line.split()[3] for line in table.splitlines()[1:]] == ["host-a", "any"]


async def note(url: str, text: str) -> None:
    """Append one notification to the log at `url`, as another process would."""
    store = await open_event_store(url)
    try:
        await store.append([EventDraft("notification", "cli-test", {"text": text},
                                       origin="human")])
    finally:
        await store.close()


def test_events_follow_prints_an_event_another_process_commits_to_postgresql(
        upulse: Upulse, tmp_path: Path, pg_url: str) -> None:
    home = pg_home(upulse, tmp_path / "home", pg_url)
    asyncio.run(note(pg_url, "before"))
    follower = subprocess.Popen(
        [sys.executable, "-m", "pulse_cli", "events", "--home", str(home), "--follow",
         "--json"], env=upulse.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert follower.stdout is not None
        assert json.loads(follower.stdout.readline())["data"] == {"text": "before"}
        asyncio.run(note(pg_url, "after"))  # committed once the follower listed the log
        assert json.loads(follower.stdout.readline())["data"] == {"text": "after"}
    finally:
        follower.terminate()
        follower.wait(10)


def test_each_reader_on_an_unreachable_postgresql_fails_in_one_line_without_the_password(
        upulse: Upulse, tmp_path: Path, pg_url: str) -> None:
    home = pg_home(upulse, tmp_path / "home", pg_url)
    configure(home, store=unreachable())
    for command in (["events"], ["effects"], ["tasks"], ["vitals"], ["tick"],
                    ["task", "create", "t-9", "--title", "x"], ["daemon", "status"]):
        done = upulse(*command, "--home", home, ok=False)
        assert done.returncode != 0, command
        assert done.stderr.count("\n") == 1, (command, done.stderr)
        assert f"{LOOPBACK}:" in done.stderr, (command, done.stderr)
        assert "s3cret-pw" not in done.stderr + done.stdout, command
        assert "Traceback" not in done.stderr, command


# -- doctor --------------------------------------------------------------------------------


def test_doctor_reports_whether_the_configured_postgresql_and_redis_answer(
        upulse: Upulse, tmp_path: Path, pg_url: str, redis_server: RedisServer) -> None:
    home = pg_home(upulse, tmp_path / "home", pg_url, "--side-store", redis_server.url())
    report = upulse.json("doctor", "--home", home)
    checks = {c["name"]: c for c in report["checks"]}  # type: ignore[index]
    assert checks["store"]["ok"] and "answers; its log holds 0 events" in checks["store"][
        "detail"]
    assert checks["side store"]["ok"]
    configure(home, store=unreachable(), side_store=f"redis://:s3cret-pw@{LOOPBACK}:"
                                                     f"{free_port()}/0")
    done = upulse("doctor", "--home", home, ok=False)
    assert done.returncode == 1
    assert "2 problem(s): store: " in done.stderr and "side store: " in done.stderr
    assert "s3cret-pw" not in done.stdout + done.stderr


def test_doctor_checks_no_server_for_a_home_kept_in_its_files(upulse: Upulse, tmp_path: Path
                                                              ) -> None:
    home = upulse.init(tmp_path / "home")
    names = [c["name"] for c in upulse.json("doctor", "--home", home)["checks"]]  # type: ignore[index]
    assert "store" not in names and "side store" not in names


# -- the daemon ----------------------------------------------------------------------------


async def test_the_daemon_runs_on_the_configured_store_side_store_and_host(
        upulse: Upulse, tmp_path: Path, pg_url: str, redis_server: RedisServer) -> None:
    home = pg_home(upulse, tmp_path / "home", pg_url, "--side-store", redis_server.url(5))
    configure(home, host="box-a", default_tick_ms=200, daemon={"drain_timeout_s": 3})
    upulse("daemon", "start", "--home", home)
    started = wait_until(lambda: upulse.json("events", "--home", home, "--kind",
                                             "engine-started"), 20, "engine-started")
    assert isinstance(started, list)
    assert started[0]["data"]["owner"].startswith("box-a:")
    status = upulse("daemon", "status", "--home", home).stdout
    assert "running (pid" in status and f"log       {pg_url}" in status
    upulse("daemon", "stop", "--home", home)
    stopped = upulse.json("events", "--home", home, "--kind", "engine-stopped")
    assert isinstance(stopped, list) and len(stopped) == 1
    assert not (home / "events.db").exists()
