"""A store URL whose password holds '#', '?', '/', '@' or '%' unencoded never shows that
password: not in the refusal of `upulse init --store`, not in `upulse daemon start`'s, not
in what the driver says of a URL it reads differently (libpq ends the user info at the first
'@' and quotes a bad '%' escape). Real CLI subprocesses; no server listens on the port."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pulse_cli.output import without_passwords
from pulse_core import redact_urls
from pulse_core.store import open_event_store
from tests.cli.runner import Upulse
from tests.servers import LOOPBACK, PostgresServer, free_port

TEST_TIME_LIMIT_S = 120

# Each password: two halves that must never be printed, around the character in question.
PASSWORDS = ["Xq7#Zw9", "Xq7?Zw9", "Xq7/Zw9", "Xq7@Zw9", "Xq7%Zw9", "Xq7:Zw9"]


def leaked(text: str) -> bool:
    return "Xq7" in text or "Zw9" in text


def url_with(password: str) -> str:
    return f"postgresql://pulse:{password}@{LOOPBACK}:{free_port()}/pulse?connect_timeout=1"


@pytest.mark.parametrize("password", PASSWORDS)
def test_init_refusing_a_store_url_never_prints_its_password(tmp_path: Path,
                                                             password: str) -> None:
    upulse = Upulse(tmp_path)
    done = upulse("init", "--home", tmp_path / "home", "--store", url_with(password),
                  ok=False)
    assert done.returncode != 0, done.stdout
    assert not leaked(done.stdout + done.stderr), done.stdout + done.stderr
    assert "postgresql://" in done.stderr, done.stderr  # it still names the store


def test_daemon_start_refusing_a_store_url_never_prints_its_password(tmp_path: Path) -> None:
    upulse = Upulse(tmp_path)
    home = upulse.init(tmp_path / "home")
    try:
        for password in PASSWORDS:
            config = json.loads((home / "config.json").read_text())
            config["store"] = url_with(password)
            (home / "config.json").write_text(json.dumps(config))
            done = upulse("daemon", "start", "--home", home, ok=False)
            log = home / "daemon.log"
            said = done.stdout + done.stderr + (log.read_text() if log.exists() else "")
            assert done.returncode != 0, (password, said)
            assert not leaked(said), (password, said)
    finally:
        upulse.stop_all()


@pytest.mark.parametrize("text", [
    "connect to postgresql://pulse:Xq7#Zw9@db.example:5432/pulse failed",
    "connect to postgresql://pulse:Xq7?Zw9@db.example/pulse failed",
    "connect to postgresql://pulse:Xq7/Zw9@db.example/pulse failed",
    "connect to postgresql://pulse:Xq7@Zw9@db.example/pulse failed",
])
def test_texts_stored_or_printed_never_hold_such_a_password(text: str) -> None:
    """redact_urls (error events, driver messages) and the CLI's without_passwords."""
    for cut in (redact_urls(text), without_passwords(text)):
        assert not leaked(cut) and "db.example" in cut and cut.endswith(" failed"), cut


@pytest.mark.parametrize("password", ["Xq7@Zw9", "Xq7%Zw9", "Xq7%41Zw9"])
async def test_a_password_holding_at_or_percent_reaches_the_server_whole(
        postgres_server: PostgresServer, password: str) -> None:
    """libpq reads the URL's user info up to its first '@', pulse up to its last: the URL
    handed to the driver is percent-encoded, so both read the same host and password."""
    url = postgres_server.create_database().replace("pulse@", f"pulse:{password}@", 1)
    store = await open_event_store(url)
    await store.close()
