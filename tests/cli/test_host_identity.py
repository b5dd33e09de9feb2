"""Each home's host name is its own: `upulse init` writes one no other home has (or the one
`--host` gives), and a home whose config.json says `"host": null` gets one made once and kept
in HOME/host.id. Two homes of one machine on one PostgreSQL log, left at their defaults, never
read each other's promotes and rollbacks. Real homes, real git, real PostgreSQL, the real
`upulse` with its promote gate and daemon."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from pulse_cli.assembly import bound_host
from pulse_cli.config import HOST_FILE, ConfigError, home_host, load
from pulse_cli.enginedir import reconcile
from pulse_core import EventDraft, EventStore
from pulse_core._lease import check_host
from pulse_core.store import open_event_store
from tests.cli.runner import Upulse, wait_until
from tests.cli.support import configure
from tests.cli.test_fleet_engine_directory import logged, main_of, promote
from tests.cli.test_postgres_home import pg_home

TEST_TIME_LIMIT_S = 150  # two promotes through the real gate, beside a running daemon
MACHINE = socket.gethostname()


def host_in_config(home: Path) -> object:
    return json.loads((home / "config.json").read_text())["host"]


def init_report(upulse: Upulse, home: Path, *extra: str) -> dict[str, object]:
    """What `upulse init --home HOME --json` says."""
    report = upulse.json("init", "--home", home, *extra)
    assert isinstance(report, dict)
    return report


def test_init_names_each_home_by_the_machine_and_a_suffix_no_other_home_has(
        upulse: Upulse, tmp_path: Path) -> None:
    reports = [init_report(upulse, tmp_path / name) for name in ("a", "b")]
    hosts = [host_in_config(tmp_path / name) for name in ("a", "b")]
    assert [r["host"] for r in reports] == hosts
    assert hosts[0] != hosts[1]
    for host in hosts:
        assert isinstance(host, str) and check_host(host) == host
        assert host.startswith(f"{MACHINE}-") and len(host) == len(MACHINE) + 7
    again = init_report(upulse, tmp_path / "a")  # kept as it is
    assert again == {"home": str(tmp_path / "a"), "instance": "a", "host": hosts[0],
                     "created": []}
    assert not (tmp_path / "a" / HOST_FILE).exists()  # config.json names it


def test_init_host_writes_the_name_given_and_init_never_changes_it_afterwards(
        upulse: Upulse, tmp_path: Path) -> None:
    home = tmp_path / "home"
    assert init_report(upulse, home, "--host", "box-7")["host"] == "box-7"
    assert host_in_config(home) == "box-7"
    upulse("init", "--home", home, "--host", "box-7")  # the same: nothing to change
    refused = upulse("init", "--home", home, "--host", "box-8", ok=False)
    assert refused.returncode == 2
    assert 'names host "box-7"; init never changes an existing home\'s settings' in (
        refused.stderr)
    assert host_in_config(home) == "box-7"


@pytest.mark.parametrize("bad", ["two words", "", "tab\there", "x" * 256])
def test_init_refuses_a_bad_host_name_saying_what_one_is_and_makes_nothing(
        upulse: Upulse, tmp_path: Path, bad: str) -> None:
    home = tmp_path / "home"
    refused = upulse("init", "--home", home, "--host", bad, ok=False)
    assert refused.returncode == 2, refused.stderr
    assert f"--host {json.dumps(bad)}: a host name is 1-255 printable characters without " \
           "spaces" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not home.exists()


def test_a_home_whose_config_says_null_keeps_one_name_of_its_own_made_once(
        upulse: Upulse, tmp_path: Path) -> None:
    homes = [upulse.init(tmp_path / name) for name in ("a", "b")]
    for home in homes:
        configure(home, host=None)  # as homes made before init wrote a name
    cfgs = [load(home / "config.json") for home in homes]
    with ThreadPoolExecutor(8) as pool:  # processes asking at once agree on one name
        first = list(pool.map(lambda n: home_host(homes[n % 2], cfgs[n % 2]), range(16)))
    assert set(first[0::2]) == {first[0]} and set(first[1::2]) == {first[1]}
    assert first[0] != first[1] and MACHINE not in (first[0], first[1])
    assert (homes[0] / HOST_FILE).read_text() == f"{first[0]}\n"
    assert (homes[0] / HOST_FILE).stat().st_mode & 0o777 == 0o600
    assert [p.name for p in homes[0].iterdir() if p.name.startswith(f".{HOST_FILE}")] == []
    assert home_host(homes[0], cfgs[0]) == first[0]  # read back, never made again
    shared = dataclasses.replace(cfgs[0], store="postgresql://u@127.0.0.1/db")
    assert bound_host(homes[0], shared) == first[0]
    assert bound_host(homes[0], cfgs[0]) == ""  # a log of its own binds nothing to a host
    (homes[1] / HOST_FILE).write_text("two words\n")
    with pytest.raises(ConfigError, match=r"host\.id: cannot read this home's host name"):
        home_host(homes[1], cfgs[1])


async def _note(url: str, text: str) -> None:
    store: EventStore = await open_event_store(url)
    try:
        await store.append([EventDraft("notification", "marker", {"text": text},
                                       origin="agent")])
    finally:
        await store.close()


def test_two_homes_of_one_machine_at_their_defaults_on_one_log_keep_apart(
        upulse: Upulse, tmp_path: Path, pg_url: str) -> None:
    a, b = (pg_home(upulse, tmp_path / name, pg_url) for name in ("a", "b"))
    configure(b, host=None)  # b as a home made before init wrote a name: host.id names it
    for home in (a, b):
        configure(home, default_tick_ms=200, daemon={"drain_timeout_s": 3})
    upulse("daemon", "start", "--home", b)
    a_before = main_of(a)
    a_promoted = promote(upulse, a)
    asyncio.run(_note(pg_url, "after a's promote"))
    wait_until(lambda: "after a's promote" in (b / "daemon.log").read_text(), 30,
               "b's daemon to narrate the notice recorded after a's promote")
    upulse("daemon", "stop", "--home", b)
    assert "promoted" not in (b / "daemon.log").read_text()  # a's promote is not b's to tell
    hosts = {home: bound_host(home, load(home / "config.json")) for home in (a, b)}
    assert hosts[a] != hosts[b] and MACHINE not in hosts.values()
    assert asyncio.run(reconcile(b, store=pg_url, host=hosts[b])) is None
    assert asyncio.run(reconcile(a, store=pg_url, host=hosts[a])) is None

    b_before = main_of(b)
    b_promoted = promote(upulse, b)  # its own key: a's promote is no revision of b's
    assert [(e.kind, e.key, e.data["revision"]) for e in logged(pg_url)] == [
        ("promote", f"engine-directory@{hosts[a]}", a_promoted),
        ("promote", f"engine-directory@{hosts[b]}", b_promoted),
    ]  # no reconcile rollback on either side
    for home, before in ((a, a_before), (b, b_before)):
        done = json.loads(upulse("rollback", "--home", home, "--json").stdout)
        assert done["to"] == before
    rollbacks = logged(pg_url, kinds=("rollback",))
    assert [(e.key, e.data["to"]) for e in rollbacks] == [
        (f"engine-directory@{hosts[a]}", a_before), (f"engine-directory@{hosts[b]}", b_before)]
