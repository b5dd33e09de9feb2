"""PostgreSQL's disk fills up under the log ("could not extend file": SQLSTATE 53100): the
append fails with StoreUnavailable saying nothing was stored and to free space, never as a
lost connection that "may or may not" have stored it; once there is room, appends go on.

The full disk is real: the log's table sits in a tablespace on a small tmpfs mount (root
only, so the test is skipped elsewhere)."""

from __future__ import annotations

import os
import pwd
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from pulse_core import EventDraft, StoreUnavailable
from pulse_core.store import open_event_store
from tests.servers import PostgresServer

TEST_TIME_LIMIT_S = 120


@pytest.fixture
def tiny_disk(postgres_server: PostgresServer) -> Iterator[Path]:
    """A 4 MB tmpfs owned by the postgres user, beside the server's data."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small filesystem needs root")
    where = postgres_server.root / f"tiny-{uuid.uuid4().hex[:8]}"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(where)],
                             capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr!r}")
    try:
        owner = pwd.getpwnam("postgres")
        os.chown(where, owner.pw_uid, owner.pw_gid)
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        where.rmdir()


async def test_an_append_on_a_full_disk_says_nothing_was_stored(
        postgres_server: PostgresServer, tiny_disk: Path) -> None:
    url = postgres_server.create_database()
    name = url.rsplit("/", 1)[1]
    space = f"tiny_{uuid.uuid4().hex[:8]}"
    postgres_server.sql(f"CREATE TABLESPACE {space} LOCATION '{tiny_disk}'")
    store = await open_event_store(url)
    try:
        postgres_server.sql(f"ALTER TABLE pulse.events SET TABLESPACE {space}", name)
        await store.append([EventDraft("tick", "before", {"n": 0})])
        big = os.urandom(300_000).hex()  # incompressible: each append needs its room
        with pytest.raises(StoreUnavailable) as refused:
            for n in range(1, 100):
                await store.append([EventDraft("tick", "filler", {"n": n, "pad": big})])
        text = str(refused.value)
        assert "nothing of it stored" in text and "disk is full" in text, text
        assert "may or may not" not in text, text
        stored = len(await store.read(kinds=["tick"]))
        postgres_server.sql("ALTER TABLE pulse.events SET TABLESPACE pg_default", name)
        await store.append([EventDraft("tick", "after", {"n": -1})])
        keys = [e.key for e in await store.read(kinds=["tick"])]
        assert len(keys) == stored + 1 and keys[0] == "before" and keys[-1] == "after"
    finally:
        await store.close()
        postgres_server.sql(f"DROP DATABASE {name}")
        postgres_server.sql(f"DROP TABLESPACE {space}")
