"""Faults of the engine and its executor loop: a disk that refuses checkpoints, failing reads,
undecodable effect rows, secrets in error texts, shutdown, and a full disk under load."""

from __future__ import annotations

import asyncio
import shutil
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

from pulse_core import (
    Decision,
    Effect,
    Engine,
    EventDraft,
    ExecutionContext,
    Executor,
    Inner,
    Layer,
    LoopState,
    Snapshot,
    SqliteVitalsStore,
    Watcher,
    _effect_index,
    redact_urls,
)
from pulse_core._effects import effect_draft
from pulse_core._supervisor import wait_signal
from pulse_core._watchers import sample_once
from tests.e2e.support import read_events
from tests.loopback import LoopbackServer, read_request
from tests.timing import scaled


class Job(Effect, tag="fault-job"):
    n: int


class Worker(Executor):
    handles = (Job,)
    timeout = 10.0
    max_attempts = 1

    def __init__(self) -> None:
        self.runs: list[tuple[int, int]] = []

    async def execute(self, effect: Job, ctx: ExecutionContext) -> int:
        self.runs.append((effect.n, ctx.attempt))
        return effect.n


async def _until(engine: Engine, check: Callable[[], Awaitable[bool]],
                 seconds: float = 10.0) -> None:
    """Wait until `check()` holds, looking again after each commit (and every 20 ms)."""
    signal = engine.events.subscribe()
    try:
        async with asyncio.timeout(scaled(seconds)):
            while not await check():
                await wait_signal(signal, 0.02)
                signal.clear()
    finally:
        engine.events.unsubscribe(signal)


async def _acked(engine: Engine, key: str) -> bool:
    return any(e.kind == "effect-acked" for e in await engine.events.read(key=key))


async def _none_unfinished(engine: Engine) -> bool:
    return engine.executor_loop.unfinished == 0


async def _add(engine: Engine, *drafts: EventDraft) -> list[str]:
    return [e.key for e in (await engine.append(list(drafts))).events]


def _executors(engine: Engine) -> Any:
    return {s.name: s for s in engine.loops()}["executors"]


async def test_the_executor_loop_survives_a_checkpoint_the_disk_refuses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fault 2: a checkpoint that cannot be written (here a file stands where the checkpoints
    folder should be) is reported once; the loop claims on, and close does not fail."""
    monkeypatch.setattr(_effect_index, "CHECKPOINT_EVERY", 1)  # a checkpoint every pass
    worker = Worker()
    engine = Engine(tmp_path, executors=[worker], executor_scan_interval=0.05)
    await engine.open()
    shutil.rmtree(engine.layout.checkpoints, ignore_errors=True)
    engine.layout.checkpoints.write_bytes(b"not a folder")
    try:
        await engine.start()
        for n in range(3):
            (key,) = await _add(engine, effect_draft(Job(n=n), origin="agent"))
            await _until(engine, lambda key=key: _acked(engine, key))  # type: ignore[misc]
        assert _executors(engine).state is LoopState.RUNNING
        assert _executors(engine).restarts == 0
    finally:
        await engine.close()
    assert [n for n, _ in worker.runs] == [0, 1, 2]
    errors = [e for e in read_events(tmp_path / "events.db", {"error"}) if "checkpoint" in e.key]
    assert len(errors) == 1  # one report for the episode, not one per pass
    assert errors[0].data["type"] in {"FileExistsError", "NotADirectoryError"}


async def test_the_executor_loop_survives_reads_the_store_fails(tmp_path: Path) -> None:
    """Fault 2: another process takes the events table away for a moment, so every read
    fails; the loop reports, backs off, and runs new effects once reads work again."""
    worker = Worker()
    engine = Engine(tmp_path, executors=[worker], executor_scan_interval=0.05)
    async with engine:
        loop = engine.executor_loop
        reported: list[str] = []
        report = loop.on_error

        def observe(where: str, exc: BaseException) -> None:
            reported.append(f"{where}: {exc}")
            report(where, exc)

        loop.on_error = observe
        (first,) = await _add(engine, effect_draft(Job(n=1), origin="agent"))
        await _until(engine, lambda: _acked(engine, first))
        foreign = sqlite3.connect(tmp_path / "events.db", isolation_level=None)
        try:
            foreign.execute("ALTER TABLE events RENAME TO events_away")
            await _until(engine, lambda: _is(len(reported) >= 2))  # failed, and again
            foreign.execute("ALTER TABLE events_away RENAME TO events")
        finally:
            foreign.close()
        (second,) = await _add(engine, effect_draft(Job(n=2), origin="agent"))
        await _until(engine, lambda: _acked(engine, second))
        assert _executors(engine).state is LoopState.RUNNING
    assert [n for n, _ in worker.runs] == [1, 2]
    assert all("no such table: events" in text for text in reported)


async def _is(value: bool) -> bool:
    return value


async def test_the_executor_loop_survives_effect_rows_that_do_not_decode(
    tmp_path: Path,
) -> None:
    """Fault 2: effect rows another writer filled badly (fields that do not convert into the
    Effect class, a body that is not an object, a claim whose fields have the wrong types)
    fail or run on their own; every effect after them still runs."""
    worker = Worker()
    engine = Engine(tmp_path, executors=[worker], executor_scan_interval=0.05)
    async with engine:
        await _add(
            engine,
            EventDraft("effect", "bad-fields", {"effect": {"type": "fault-job", "n": "one"},
                                                "dedup": "bad-fields"}, origin="executor:foreign"),
            EventDraft("effect", "bad-body", {"effect": ["fault-job"], "dedup": "bad-body"},
                       origin="executor:foreign"),
            EventDraft("effect", "bad-claim", {"effect": {"type": "fault-job", "n": 3},
                                               "dedup": "bad-claim"}, origin="executor:foreign"))
        await engine.append([EventDraft(
            "effect-executing", "bad-claim",
            {"attempt": "two", "lease_until": "never", "owner": 5, "pid": "x",
             "started": [1]}, origin="executor:foreign")], expect={"bad-claim": 1})
        (good,) = await _add(engine, effect_draft(Job(n=4), origin="agent"))
        await _until(engine, lambda: _acked(engine, good))
        await _until(engine, lambda: _acked(engine, "bad-claim"))
        await _until(engine, lambda: _none_unfinished(engine))  # the index folds the acks
        await engine.supervisor.settle()
        failed = {e.key: e.data for e in await engine.events.read(kinds=["effect-failed"])}
        assert _executors(engine).restarts == 0
    assert sorted(worker.runs) == [(3, 2), (4, 1)]
    assert set(failed) == {"bad-fields", "bad-body"}
    assert all(data["final"] for data in failed.values())
    assert "Expected `int`, got `str`" in failed["bad-fields"]["error"]
    assert failed["bad-body"]["error"].startswith("no executor handles effect ''")
    errors = read_events(tmp_path / "events.db", {"error"})
    assert [e for e in errors if "executor-loop" in e.key] == []


SECRETS = ("hookuser", "hunter2pass", "T0KEN-path", "K3Y-query", "FR4G-fragment")
SECRET_URL = "http://hookuser:hunter2pass@127.0.0.1:9/T0KEN-path?key=K3Y-query#FR4G-fragment"


class Hook(Effect, tag="fault-hook"):
    text: str


async def post(url: str, text: str) -> None:
    """POST `text` to `url`, raising on an HTTP error, as a webhook sink does."""
    async with httpx.AsyncClient() as client:
        response = await client.post(url, json={"text": text})
        response.raise_for_status()


class Webhook(Executor):
    handles = (Hook,)
    timeout = 5.0
    max_attempts = 1

    def __init__(self, url: str) -> None:
        self.url = url

    async def execute(self, effect: Hook, ctx: ExecutionContext) -> str:
        await post(self.url, effect.text)
        return "delivered"


class Refusing(BaseHTTPRequestHandler):
    requests: ClassVar[list[str]] = []

    def do_POST(self) -> None:
        Refusing.requests.append(read_request(self).path)
        self.send_response(500)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        return


async def test_no_stored_error_holds_a_url_s_secrets(tmp_path: Path) -> None:
    """Fault 6: a webhook answering 500 (its URL carries a user and password, a path token,
    a query key and a fragment) fails its effect, and a service posting to it fails its
    loop: the effect-failed error, the error event and the loop's status keep only the
    scheme and host, and no secret is anywhere in events.db."""
    server = LoopbackServer()
    server.serve(Refusing)
    origin = f"http://127.0.0.1:{server.port}"
    url = (f"http://hookuser:hunter2pass@127.0.0.1:{server.port}/hooks/T0KEN-path"
           "?key=K3Y-query#FR4G-fragment")

    async def poster(engine: Engine) -> None:
        await post(url, "from a service")

    async def hook_once(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        effects, tick_ms = await inner(prev, curr)
        return Decision([*effects, Hook(text="hi")] if curr.number == 1 else effects, tick_ms)

    engine = Engine(tmp_path, layers=[Layer("hooks", services=[poster])], rules=[hook_once],
                    executors=[Webhook(url)])
    try:
        async with engine:
            async def failed_and_reported() -> bool:
                await engine.supervisor.settle()
                return bool(await engine.events.read(kinds=["effect-failed"])
                            and await engine.events.read(kinds=["error"]))

            await _until(engine, failed_and_reported)
            status = {s.name: s for s in engine.loops()}["service:poster"]
    finally:
        server.shutdown()
    assert len(Refusing.requests) >= 2 and "T0KEN-path" in Refusing.requests[0]
    (failed,) = read_events(tmp_path / "events.db", {"effect-failed"})
    assert f"for url '{origin}'" in failed.data["error"]
    error = next(e for e in read_events(tmp_path / "events.db", {"error"})
                 if e.key.endswith("service:poster"))
    assert f"for url '{origin}'" in error.data["message"] and origin in error.data["trace"]
    assert status.last_error is not None and origin in status.last_error
    texts = [failed.data["error"], error.data["message"], error.data["trace"],
             status.last_error]
    stored = await asyncio.to_thread(_stored_bytes, tmp_path)
    for secret in SECRETS:
        assert not any(secret in text for text in texts), secret
        assert secret.encode() not in stored, secret


@pytest.mark.parametrize(("text", "kept"), [
    ("for url 'https://u:p%40ss@hooks.example.com:8443/t/T0K?key=K#F'",
     "for url 'https://hooks.example.com:8443'"),
    ("see (http://[::1]:9000/a/b?c=d).", "see (http://[::1]:9000)."),
    ("postgresql://pulse:pw@db/pulse?sslmode=require down", "postgresql://db down"),
    ("two: http://a.example/x and ftp://me@files.example/y", "two: http://a.example and "
     "ftp://files.example"),
    ("http://host:80", "http://host:80"),
    ("no url: a://", "no url: a://"),
    ("https://user:pa/ss@host.example/x?k=v", "https://host.example"),
    ("https://h.example\\path\\S3CRET", "https://h.example"),
    ("(https://u@h.example:1/p?q=a@b#c@d)", "(https://h.example:1)"),
])
def test_redact_urls_keeps_scheme_and_host_only(text: str, kept: str) -> None:
    """Fault 6: users, passwords, paths, queries and fragments go; scheme, host and port stay,
    and so does the text around the URL."""
    assert redact_urls(text) == kept


async def test_a_watcher_error_keeps_a_url_s_scheme_and_host_only(tmp_path: Path) -> None:
    """Fault 6 (the watchers' share): a collect that fails with a URL in its message stored
    the URL whole in vitals.db (httpx errors name the URL they fetched)."""
    class Fetching(Watcher):
        name = "fetching"
        interval = 1.0

        async def collect(self) -> None:
            raise ConnectionError(f"GET {SECRET_URL} failed")

    vitals = await SqliteVitalsStore.open(tmp_path / "vitals.db")
    try:
        sample = await sample_once(Fetching(), vitals)
    finally:
        await vitals.close()
    assert sample.error is not None and "http://127.0.0.1" in sample.error
    stored = _stored_bytes(tmp_path, "vitals.db")
    for secret in SECRETS:
        assert secret not in sample.error and secret.encode() not in stored


def _stored_bytes(home: Path, db: str = "events.db") -> bytes:
    """Everything in `db` and its -wal and -shm, as bytes on disk."""
    return b"".join(p.read_bytes() for p in home.glob(f"{db}*"))


async def test_close_claims_nothing_new_and_returns_when_running_attempts_end(
    tmp_path: Path,
) -> None:
    """Fault 12: close starts no attempt (none to be interrupted), never claims more than
    there are free slots, and returns once the attempts running end, not at the deadline."""

    class Slow(Executor):
        """Attempts started before close wait for `gate`; one started after hangs."""

        handles = (Job,)
        timeout = 60.0

        def __init__(self) -> None:
            self.gate = asyncio.Event()
            self.closing = False
            self.started: list[tuple[int, bool]] = []

        async def execute(self, effect: Job, ctx: ExecutionContext) -> int:
            self.started.append((effect.n, self.closing))
            await (asyncio.sleep(3600) if self.closing else self.gate.wait())
            return effect.n

    async def six_jobs(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
        return Decision([Job(n=n) for n in range(6)] if curr.number == 1 else [], 60_000)

    worker = Slow()
    engine = Engine(tmp_path, rules=[six_jobs], executors=[worker], executor_concurrency=2,
                    drain_timeout=40.0)
    loop = asyncio.get_running_loop()
    async with engine:
        await _until(engine, lambda: _is(len(worker.started) == 2))
        claims = len(await engine.events.read(kinds=["effect-executing"]))
        worker.closing = True
        loop.call_soon(worker.gate.set)
        began = loop.time()
    took = loop.time() - began
    assert claims == 2  # two slots, two claims: the other four wait unclaimed
    assert [closing for _, closing in worker.started] == [False, False]
    assert len(read_events(tmp_path / "events.db", {"effect-executing"})) == 2
    assert len(read_events(tmp_path / "events.db", {"effect-acked"})) == 2
    assert read_events(tmp_path / "events.db", {"effect-failed"}) == []
    (stopped,) = read_events(tmp_path / "events.db", {"engine-stopped"})
    assert stopped.data["interrupted"] == 0
    assert took < engine.drain_timeout / 2  # closed when the two finished, not at the bound


FULL_DISK_ENGINE = textwrap.dedent(
    """
    import asyncio, logging, resource, signal, sqlite3, sys
    from pulse_core import Effect, Engine, Executor
    from pulse_core._effects import effect_draft

    logging.basicConfig(stream=sys.stderr, level=logging.INFO)

    class Job(Effect, tag="full-job"):
        n: int

    class Worker(Executor):
        handles = (Job,)
        async def execute(self, effect, ctx):
            return effect.n

    async def main(home):
        engine = Engine(home, executors=[Worker()], default_tick_ms=100,
                        executor_scan_interval=0.05)
        await engine.open()
        await engine.append([effect_draft(Job(n=n), origin="agent") for n in range(40)])
        with sqlite3.connect(home + "/events.db") as conn:
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # no file may grow now
        await engine.start()
        await asyncio.sleep(0.5)
        await engine.close()
        print("closed")

    asyncio.run(main(sys.argv[1]))
    """
)


async def test_a_full_disk_logs_failed_reports_once_and_leaves_no_task_unobserved(
    tmp_path: Path,
) -> None:
    """Fault 22: on a full disk every claim fails and so does every error report about it;
    each report task is observed (no "Task exception was never retrieved") and the log gets
    a line and a count, not one traceback per report."""
    child = await asyncio.to_thread(
        subprocess.run, [sys.executable, "-c", FULL_DISK_ENGINE, str(tmp_path)],
        check=False, capture_output=True, text=True, timeout=60)
    assert child.returncode == 0 and child.stdout.strip() == "closed", child.stderr
    assert "never retrieved" not in child.stderr
    background = [line for line in child.stderr.splitlines() if "background" in line]
    assert background and "disk" in background[0]
    assert len(background) <= 3, "\n".join(background)
    assert "more background tasks failed" in child.stderr or "more failed" in child.stderr
