"""Engine directories of several hosts on one PostgreSQL log: each home records its promotes
and rollbacks under its own key (`engine-directory@<host>`, the host named in the data), and
whatever compares main with the log (promote, rollback, a starting daemon) or rolls back to
before the last promote (`upulse rollback`, the survival layer) reads only that key. A home
kept in its own SQLite log records them as it always did. Real PostgreSQL, real git, the
real `upulse`, its promote gate and its daemon."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path

import pytest

from pulse_cli.enginedir import reconcile
from pulse_core import Event, EventStore, SqliteEventStore
from pulse_core._effects import effect_draft
from pulse_core.store import open_event_store
from pulse_survival import Rollback
from tests.cli.runner import Upulse, wait_until
from tests.cli.support import (
    configure,
    git,
    promote_event,
    promote_without_gate,
    stage_new_text,
)
from tests.cli.test_postgres_home import pg_home
from tests.e2e.support import read_events

TEST_TIME_LIMIT_S = 120  # two promotes through the real gate, and a daemon in some tests
PROMOTE_TIMEOUT_S = 100
DIRECTORY_KINDS = ("promote", "rollback")


@dataclass(frozen=True)
class Fleet:
    """Two homes, host-a and host-b, on one PostgreSQL log (`url`): host-b promoted first
    (main from `b_before` to `b_promoted`), then host-a, whose main has a history of its own
    (from `a_before` to `a_promoted`); `seq` is the log's last seq after both."""

    url: str
    a: Path
    b: Path
    a_before: str
    a_promoted: str
    b_before: str
    b_promoted: str
    seq: int


async def _read(url: str, after: int, kinds: tuple[str, ...] | None) -> list[Event]:
    store: EventStore = await open_event_store(url, read_only=True)
    try:
        return await store.read(after, kinds=kinds)
    finally:
        await store.close()


def logged(url: str, after: int = 0, kinds: tuple[str, ...] | None = DIRECTORY_KINDS
           ) -> list[Event]:
    """The events of `kinds` (None: every event) after seq `after` in the log at `url`."""
    return asyncio.run(_read(url, after, kinds))


def last_seq(url: str) -> int:
    return max((e.seq for e in logged(url, kinds=None)), default=0)


def main_of(home: Path) -> str:
    return git(home / "engine", "rev-parse", "HEAD")


def files_of(home: Path, revision: str) -> str:
    return git(home / "engine", "rev-parse", f"{revision}^{{tree}}")


def promote(upulse: Upulse, home: Path) -> str:
    """A good edit staged and promoted through the real gate; main's revision after it."""
    stage_new_text(home / "staging")
    upulse("promote", "--home", home, timeout=PROMOTE_TIMEOUT_S)
    return main_of(home)


@pytest.fixture
def fleet(upulse: Upulse, tmp_path: Path, pg_url: str) -> Fleet:
    """host-b promotes, then host-a (after a commit of its own on main, so that host-a's
    `previous` is no revision of host-b's): host-a's promote is the log's last."""
    a, b = tmp_path / "host-a", tmp_path / "host-b"
    for home, host in ((a, "host-a"), (b, "host-b")):
        pg_home(upulse, home, pg_url)
        configure(home, host=host, default_tick_ms=200, daemon={"drain_timeout_s": 3})
    b_before = main_of(b)
    b_promoted = promote(upulse, b)
    git(a / "engine", "commit", "-q", "--allow-empty", "-m", "host-a's own history")
    a_before = main_of(a)
    a_promoted = promote(upulse, a)
    return Fleet(pg_url, a, b, a_before, a_promoted, b_before, b_promoted, last_seq(pg_url))


def test_each_hosts_promote_is_recorded_under_its_own_key_naming_its_host(
        fleet: Fleet) -> None:
    assert [(e.kind, e.key, e.data) for e in logged(fleet.url)] == [
        ("promote", "engine-directory@host-b",
         {"revision": fleet.b_promoted, "previous": fleet.b_before, "host": "host-b"}),
        ("promote", "engine-directory@host-a",
         {"revision": fleet.a_promoted, "previous": fleet.a_before, "host": "host-a"}),
    ]  # no rollback: host-a's promote did not take host-b's for a promote of its own


def test_reconcile_on_one_host_records_nothing_after_another_hosts_promote(
        fleet: Fleet) -> None:
    assert asyncio.run(reconcile(fleet.b, store=fleet.url, host="host-b")) is None
    assert logged(fleet.url, fleet.seq) == []


def test_a_daemon_starting_on_one_host_records_nothing_after_another_hosts_promote(
        upulse: Upulse, fleet: Fleet) -> None:
    upulse("daemon", "start", "--home", fleet.b)  # returns once the daemon is ready
    upulse("daemon", "stop", "--home", fleet.b)
    started = logged(fleet.url, fleet.seq, ("engine-started",))
    assert [e.data["owner"].split(":")[0] for e in started] == ["host-b"]
    assert logged(fleet.url, fleet.seq) == []


def test_rollback_on_one_host_goes_back_to_its_own_last_promote_not_another_hosts(
        upulse: Upulse, fleet: Fleet) -> None:
    done = json.loads(upulse("rollback", "--home", fleet.b, "--reason", "host-b's call",
                             "--json").stdout)
    assert done["to"] == fleet.b_before
    assert main_of(fleet.b) == done["revision"]
    assert files_of(fleet.b, done["revision"]) == files_of(fleet.b, fleet.b_before)
    assert main_of(fleet.a) == fleet.a_promoted  # host-a's engine directory is untouched
    [rollback] = logged(fleet.url, fleet.seq)
    assert (rollback.kind, rollback.key, rollback.origin) == (
        "rollback", "engine-directory@host-b", "cli")
    assert rollback.data == {"revision": done["revision"], "to": fleet.b_before,
                             "reason": "host-b's call", "kept": done["kept"],
                             "staging": "synced", "host": "host-b"}


async def _append_rollback_effect(url: str, host: str) -> None:
    store: EventStore = await open_event_store(url)
    try:
        await store.append([effect_draft(Rollback(reason="the test says so"), origin="agent",
                                         host=host)])
    finally:
        await store.close()


def test_the_survival_layer_on_one_host_rolls_back_its_own_last_promote_not_another_hosts(
        upulse: Upulse, fleet: Fleet) -> None:
    upulse("daemon", "start", "--home", fleet.b)
    asyncio.run(_append_rollback_effect(fleet.url, "host-b"))

    def finished() -> list[Event]:
        return logged(fleet.url, fleet.seq, ("effect-acked", "effect-failed"))

    wait_until(finished, 30, "host-b's daemon to run the Rollback")
    [outcome] = finished()
    assert outcome.kind == "effect-acked", outcome.data
    [rollback] = logged(fleet.url, fleet.seq)
    assert (rollback.key, rollback.origin, rollback.data["host"]) == (
        "engine-directory@host-b", "survival", "host-b")
    assert rollback.data["to"] == fleet.b_before
    assert files_of(fleet.b, main_of(fleet.b)) == files_of(fleet.b, fleet.b_before)

    def reloaded() -> bool:
        report = json.loads(upulse("daemon", "status", "--home", fleet.b, "--json").stdout)
        return bool(report["status"]["revision"] == rollback.data["revision"])

    wait_until(reloaded, 20, "host-b's daemon to reload the rolled-back revision")
    upulse("daemon", "stop", "--home", fleet.b)
    assert main_of(fleet.a) == fleet.a_promoted


def test_a_home_on_its_own_sqlite_log_records_under_the_plain_key_without_a_host(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    configure(home, host="host-a")  # a log of its own binds nothing to a host
    before = main_of(home)
    promoted = promote(upulse, home)
    upulse("rollback", "--home", home, "--reason", "back")
    assert [(e.kind, e.key, e.data.get("host"), e.data["revision"])
            for e in read_events(home / "events.db", set(DIRECTORY_KINDS))] == [
        ("promote", "engine-directory", None, promoted),
        ("rollback", "engine-directory", None, main_of(home)),
    ]
    assert files_of(home, main_of(home)) == files_of(home, before)


# -- a home moved from its own SQLite log to PostgreSQL (`upulse migrate --switch`) ----------


def migrate_switch(upulse: Upulse, home: Path, url: str) -> dict[str, object]:
    report = json.loads(upulse("migrate", "--home", home, "--to", url, "--switch",
                               "--json").stdout)
    assert isinstance(report, dict)
    assert report["verified"] is True and report["switched"] is True
    return report


def test_migrate_switch_carries_the_last_promote_over_to_the_host_key_so_rollback_undoes_it(
        upulse: Upulse, tmp_path: Path, pg_url: str) -> None:
    home = upulse.init(tmp_path / "home")
    configure(home, host="host-a")
    git(home / "engine", "commit", "-q", "--allow-empty", "-m", "main's own history")
    before = main_of(home)  # so the promote merges main: its HEAD~1 is not `before`
    promoted = promote(upulse, home)
    [original] = read_events(home / "events.db", {"promote"})
    report = migrate_switch(upulse, home, pg_url)
    copied = report["events"]
    assert isinstance(copied, int)
    [restated] = logged(pg_url, copied)
    assert (restated.kind, restated.key, restated.origin) == (
        "promote", "engine-directory@host-a", "cli")
    assert restated.data == {"revision": promoted, "previous": before, "host": "host-a",
                             "migrated_from": original.seq}
    assert report["carried_over"] == [restated.seq]
    assert logged(pg_url)[0] == original  # the copied row is as it was
    assert asyncio.run(reconcile(home, store=pg_url, host="host-a")) is None
    assert logged(pg_url, restated.seq) == []  # main agrees with the restated promote
    done = json.loads(upulse("rollback", "--home", home, "--reason", "after the move",
                             "--json").stdout)
    assert done["to"] == before
    assert files_of(home, main_of(home)) == files_of(home, before)
    [rollback] = logged(pg_url, restated.seq)
    assert (rollback.key, rollback.data["to"]) == ("engine-directory@host-a", before)


async def _promote_recorded_but_not_applied(home: Path) -> str:
    """A `promote` event under the plain key for a staged commit main never moved to (the
    process stopped between the event and git); the commit's revision."""
    stage_new_text(home / "staging")
    git(home / "staging", "commit", "-q", "-am", "staged")
    staged = git(home / "staging", "rev-parse", "HEAD")
    store = await SqliteEventStore.open(home / "events.db")
    try:
        await store.append([promote_event(staged, main_of(home))])
    finally:
        await store.close()
    return staged


async def _promote_without_gate(home: Path) -> str:
    """A good edit promoted as promote does once its gate passed (the gate is tested above)."""
    stage_new_text(home / "staging")
    store = await SqliteEventStore.open(home / "events.db")
    try:
        return await promote_without_gate(home, store)
    finally:
        await store.close()


def test_after_migrate_switch_reconcile_still_sees_a_promote_whose_main_never_moved(
        upulse: Upulse, tmp_path: Path, pg_url: str) -> None:
    home = upulse.init(tmp_path / "home")
    configure(home, host="host-a")
    main = main_of(home)
    staged = asyncio.run(_promote_recorded_but_not_applied(home))
    copied = migrate_switch(upulse, home, pg_url)["events"]
    assert isinstance(copied, int)
    reason = asyncio.run(reconcile(home, store=pg_url, host="host-a"))
    assert reason is not None and f"a promote to {staged} was recorded but main never moved" \
        in reason
    [restated, noted] = logged(pg_url, copied)
    assert (restated.kind, restated.data["revision"]) == ("promote", staged)
    assert (noted.kind, noted.key, noted.data["revision"]) == (
        "rollback", "engine-directory@host-a", main)


def test_migrate_switch_restates_a_rollback_made_after_the_last_promote_after_that_promote(
        upulse: Upulse, tmp_path: Path, pg_url: str) -> None:
    home = upulse.init(tmp_path / "home")
    configure(home, host="host-a")
    before = main_of(home)
    promoted = asyncio.run(_promote_without_gate(home))
    upulse("rollback", "--home", home, "--reason", "not yet")
    rolled_back = main_of(home)
    originals = read_events(home / "events.db", set(DIRECTORY_KINDS))
    copied = migrate_switch(upulse, home, pg_url)["events"]
    assert isinstance(copied, int)
    assert [(e.kind, e.key, e.data["revision"], e.data["migrated_from"])
            for e in logged(pg_url, copied)] == [
        ("promote", "engine-directory@host-a", promoted, originals[0].seq),
        ("rollback", "engine-directory@host-a", rolled_back, originals[1].seq),
    ]
    assert asyncio.run(reconcile(home, store=pg_url, host="host-a")) is None
    assert files_of(home, rolled_back) == files_of(home, before)
