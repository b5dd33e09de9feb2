"""Faults of the survival layer: blocking collects, symlinked folders, error floods, configs
that passed the check and broke later, webhook errors that leaked their URL."""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest

from pulse_core import (
    Engine,
    ExecutionContext,
    ManualClock,
    PulseError,
    Sample,
    SqliteEventStore,
    SystemClock,
    VitalsStore,
    Watcher,
)
from pulse_core._effects import effect_draft
from pulse_survival import (
    ErrorLogPolicy,
    Notify,
    NotifySinks,
    ResourceThresholds,
    RestartProcess,
    SurvivalConfig,
    SurvivalConfigError,
    load_config,
)
from pulse_survival.executors import (
    FolderRefused,
    NotifyExecutor,
    RestartProcessExecutor,
    move_old_files,
)
from pulse_survival.watchers import ErrorLogWatcher
from tests.loopback import LOOPBACK, LoopbackServer
from tests.timing import scaled

# -- 3: a blocking collect must not starve the engine -----------------------------------------


def release_readers(fifo: Path) -> None:
    """Open `fifo` for writing until no reader is left waiting on it (a reader stuck in
    open() returns once a writer opens), so no thread of a failing run outlives the test."""
    for _ in range(64):
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return  # nobody is reading
            raise
        os.close(fd)


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    """A named pipe nobody writes to, released after the test."""
    path = tmp_path / "app.log"
    os.mkfifo(path)
    try:
        yield path
    finally:
        release_readers(path)


async def test_a_fifo_followed_as_a_log_neither_stops_the_ticks_nor_hangs_close(
    tmp_path: Path, fifo: Path
) -> None:
    """Fault 3: the error-log watcher opened a FIFO in a worker thread; each timed-out collect
    stranded one more thread until the shared pool was full, every tick stopped and close()
    hung. Now the FIFO is refused at once, with a message in the sample."""
    engine = Engine(tmp_path / "home", default_tick_ms=20, survival=SurvivalConfig(
        error_log=ErrorLogPolicy(files=(str(fifo),))))
    (watcher,) = [w for w in engine.watchers if isinstance(w, ErrorLogWatcher)]
    watcher.interval = watcher.timeout = 0.02  # a collect every 20 ms, timed out after 20 ms
    await engine.open()
    try:
        await engine.start()
        first = engine.ticks

        async def collected(count: int) -> bool:
            return len(await engine.vitals.window("error-log", 0)) >= count

        await until(lambda: collected(30))  # more collects than the shared pool has threads
        middle = engine.ticks
        await until(lambda: asyncio.sleep(0, engine.ticks > middle))  # ticks go on
        assert middle > first
    finally:
        await asyncio.wait_for(engine.close(), 5)
    sample = (await _vitals_after(tmp_path / "home"))["error-log"]
    assert sample.ok, sample.error
    assert sample.data["refused"] == {
        str(fifo): f"{fifo} is a FIFO, not a regular file — error_log.files must name "
                   "regular log files"}


class Stuck(Watcher):
    """A watcher whose every collect blocks a thread until `gate` opens."""

    name = "stuck"
    interval = 0.01
    timeout = 0.02

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.started = 0

    def _block(self) -> int:
        self.started += 1
        self.gate.wait(30)
        return self.started

    async def collect(self) -> int:
        return await self.in_thread(self._block)


async def test_a_collect_stuck_in_a_thread_is_skipped_not_started_again(
    tmp_path: Path,
) -> None:
    """Fault 3: timed-out collects piled up, one stranded thread each. Now a watcher whose
    previous collect still holds its thread is skipped (a sample says so): one thread, the
    ticks go on, sampling resumes once the thread ends, and close() does not wait for it."""
    watcher = Stuck()
    engine = Engine(tmp_path / "home", watchers=[watcher], default_tick_ms=20)
    await engine.open()
    try:
        await engine.start()
        first = engine.ticks

        async def skipped_often() -> bool:  # intervals that found the first thread blocked
            samples = await engine.vitals.window("stuck", 0)
            return sum("skipped" in (s.error or "") for s in samples) >= 5

        await until(skipped_often)
        assert watcher.started == 1
        await until(lambda: asyncio.sleep(0, engine.ticks > first))  # ticks go on
        samples = await engine.vitals.window("stuck", 0)
        assert "timed out after 0.02 s; its thread is still blocked" in (samples[0].error or "")
        skipped = [s.error or "" for s in samples if "skipped" in (s.error or "")]
        assert len(skipped) >= 5
        assert "a thread of an earlier collect has been blocked for" in skipped[-1]

        watcher.gate.set()
        await until(lambda: latest_ok(engine, "stuck"))
        assert (await engine.vitals.latest(["stuck"]))["stuck"].data >= 2  # it samples again

        watcher.gate.clear()
        await until(lambda: asyncio.sleep(0, watcher.busy_for() is not None))
        await asyncio.wait_for(engine.close(), scaled(10))  # while a thread is blocked again
    finally:
        watcher.gate.set()
        await engine.close()


async def latest_ok(engine: Engine, key: str) -> bool:
    sample = (await engine.vitals.latest([key])).get(key)
    return sample is not None and sample.ok


async def until(predicate: Callable[[], Awaitable[bool]], within: float = 10.0) -> None:
    """Poll `predicate` every 20 ms until it holds; fail after `within` seconds (scaled)."""
    within = scaled(within)
    for _ in range(int(within / 0.02)):
        if await predicate():
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"not within {within:g} s")


async def _vitals_after(home: Path) -> dict[str, Sample]:
    vitals = await VitalsStore.open(home / "vitals.db")
    try:
        return dict(await vitals.latest(["error-log"]))
    finally:
        await vitals.close()


async def test_a_fifo_a_directory_and_a_socket_are_refused_and_the_regular_logs_still_counted(
    tmp_path: Path, fifo: Path
) -> None:
    """Fault 3: only regular files are followed; what else sits at a followed path is named
    in the sample, and the other files are read as before."""
    folder = tmp_path / "a-folder.log"
    folder.mkdir()
    sock_path = tmp_path / "s.log"
    good = tmp_path / "good.log"
    good.write_text("")
    watcher = ErrorLogWatcher([str(fifo), str(folder), str(sock_path), str(good)], ["ERROR"])
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(sock_path))
        try:
            assert (await asyncio.wait_for(watcher.collect(), 5))["matches"] == 0  # starts
            good.write_text("ERROR counted\n")
            data = await asyncio.wait_for(watcher.collect(), 5)
        finally:
            await watcher.aclose()
    assert data["matches"] == 1 and data["examples"] == ["ERROR counted"]
    assert {path: text.split(" is ")[1].split(",")[0]
            for path, text in data["refused"].items()} == {
        str(fifo): "a FIFO", str(folder): "a directory", str(sock_path): "a socket"}


async def test_a_followed_file_replaced_by_a_fifo_is_read_to_its_end_then_refused(
    tmp_path: Path,
) -> None:
    """Fault 3: a rotation that puts a FIFO where the log was: the old file's last lines are
    counted, the FIFO is refused, and a regular file that comes back is read from its start."""
    log = tmp_path / "app.log"
    log.write_text("")
    watcher = ErrorLogWatcher([str(log)], ["ERROR"])
    try:
        await watcher.collect()
        with log.open("a") as out:
            out.write("ERROR last words\n")
        log.rename(tmp_path / "app.log.1")
        os.mkfifo(log)
        try:
            data = await asyncio.wait_for(watcher.collect(), 5)
        finally:
            release_readers(log)
        assert data["matches"] == 1 and str(log) in data["refused"]
        log.unlink()
        log.write_text("ERROR back\n")
        assert (await watcher.collect())["examples"] == ["ERROR back"]
    finally:
        await watcher.aclose()


# -- 5: archive-sessions and cleanup never leave their folders ---------------------------------


def old(path: Path, text: str = "payload", days: int = 30) -> Path:
    """A file at `path` last modified `days` ago."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    when = time.time() - days * 86_400
    os.utime(path, (when, when))
    return path


async def pressure_once(engine: Engine) -> None:
    """One memory-pressure sample, one tick, and the executors until idle."""
    await engine.vitals.record("system-resource", {
        "cpu_pct": 5.0, "memory_pct": 99.0, "swap_pct": 0.0, "disk_pct": {"/": 40.0}})
    await engine.tick()
    await engine.executor_loop.run_until_idle()


@pytest.mark.parametrize(("folder", "reason"), [
    ("symlink-to-home", "is a symlink"),
    ("the-home-itself", "is in the engine's home"),
    ("objects", "is in the home's objects/"),
    ("objects-through-a-link", "is in the home's objects/"),
])
async def test_a_session_folder_that_leads_to_the_home_moves_nothing(
    tmp_path: Path, folder: str, reason: str
) -> None:
    """Fault 5: with a session folder that was a symlink to the home, month-old payloads
    were moved out of objects/. Now such a folder, the home named directly, or pulse's data
    in it (however it is reached) is refused: the effect fails saying why, nothing moves."""
    home = tmp_path / "home"
    payload = old(home / "objects" / "ab" / ("cd" * 31))
    sessions = {"symlink-to-home": tmp_path / "sessions", "the-home-itself": home,
                "objects": home / "objects",
                "objects-through-a-link": tmp_path / "link" / "objects"}[folder]
    if folder == "symlink-to-home":
        sessions.symlink_to(home, target_is_directory=True)
    elif folder == "objects-through-a-link":
        (tmp_path / "link").symlink_to(home, target_is_directory=True)
    engine = Engine(home, survival=SurvivalConfig(resource=ResourceThresholds(
        memory_pct=90, samples=1, session_folders=(str(sessions),), older_than_s=86_400)))
    await engine.open()
    try:
        await pressure_once(engine)
        failed = [e for e in await engine.events.read(kinds=["effect-failed"])]
        effects = {e.key: e.data["effect"]["type"]
                   for e in await engine.events.read(kinds=["effect"])}
    finally:
        await engine.close()
    assert payload.read_text() == "payload"
    assert not (home / "archive").exists() or not any((home / "archive").rglob("*.*"))
    errors = [e.data["error"] for e in failed if effects[e.key] == "archive-sessions"]
    assert errors and all("FolderRefused" in text for text in errors)
    assert reason in errors[0]


@pytest.mark.parametrize(("archive", "reason"), [
    ("a-symlink", "is a symlink"),
    ("in-objects", "lies in the home's objects/"),
])
def test_an_archive_that_is_a_symlink_or_in_pulse_data_moves_nothing(
    tmp_path: Path, archive: str, reason: str
) -> None:
    """Fault 5 (the archive's share): an archive_to that was a symlink, or inside the home's
    objects/, received the moved files."""
    home, temp = tmp_path / "home", tmp_path / "temp"
    stale = old(temp / "stale.tmp")
    target = home / "objects" / "archive"
    if archive == "a-symlink":
        (tmp_path / "elsewhere").mkdir()
        target = tmp_path / "archive"
        target.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    with pytest.raises(FolderRefused, match=reason):
        move_old_files([str(temp)], target, 86_400, 10, home=home)
    assert stale.exists()


def test_the_homes_logs_and_folders_around_the_home_may_be_cleaned(tmp_path: Path) -> None:
    """What stays allowed: HOME/logs (restarted processes' output), and a folder holding the
    home, whose walk skips the home."""
    home = tmp_path / "home"
    log = old(home / "logs" / "worker.log")
    payload = old(home / "objects" / "ab" / ("cd" * 31))
    stray = old(tmp_path / "stray.tmp")
    report = move_old_files([str(home / "logs"), str(tmp_path)], home / "archive", 86_400, 10,
                            home=home)
    assert report["moved"] == 2 and not log.exists() and not stray.exists()
    assert payload.exists()


async def test_a_symlinked_subfolder_or_file_inside_a_temp_folder_is_never_followed_out(
    tmp_path: Path,
) -> None:
    """Fault 5: inside a configured folder, a symlinked subfolder is not entered and a
    symlink is not a file to move; what is really inside still moves."""
    outside = tmp_path / "etc"
    secret = old(outside / "passwd", "root:x:0:0")
    temp = tmp_path / "tmp-folder"
    mine = old(temp / "old.tmp")
    (temp / "sub").symlink_to(outside, target_is_directory=True)
    (temp / "file-link").symlink_to(secret)
    os.utime(temp / "file-link", (0, 0), follow_symlinks=False)
    home = tmp_path / "home"
    engine = Engine(home, survival=SurvivalConfig(resource=ResourceThresholds(
        memory_pct=90, samples=1, temp_folders=(str(temp),), older_than_s=86_400)))
    await engine.open()
    try:
        await pressure_once(engine)
        (acked,) = await engine.events.read(kinds=["effect-acked"])
    finally:
        await engine.close()
    assert acked.data["result"]["files"] == [str(mine)]
    assert secret.read_text() == "root:x:0:0" and (temp / "sub").is_symlink()
    assert (temp / "file-link").is_symlink()
    assert (home / "archive" / "tmp-folder" / "old.tmp").read_text() == "payload"


# -- 13: an error flood is one notice, then bounded digests ------------------------------------


async def test_200_error_lines_are_one_notification_and_a_flood_stays_bounded(
    tmp_path: Path,
) -> None:
    """Fault 13: error_escalate sent one notification per error line (200 lines, 200
    notices; a 10 MB/s log made 1,403 notices and ~7,000 events a minute). Now: one digest at
    once, the rest held for the next digest (at most one every digest_every_s)."""
    log = tmp_path / "app.log"
    log.write_text("")
    engine = Engine(tmp_path / "home", default_tick_ms=50, survival=SurvivalConfig(
        error_log=ErrorLogPolicy(files=(str(log),), interval_s=0.5, patrol_tick_ms=200,
                                 patterns=("ERROR", "CRITICAL"))))
    async with engine:
        await until(lambda: has_sample(engine, "error-log"))
        with log.open("a") as out:
            out.writelines(f"ERROR number {n}\n" for n in range(200))
        await until(lambda: notices(engine, 1))
        for n in range(40):  # a flood: 2,000 lines more over ~0.8 s, many collects
            with log.open("a") as out:
                out.writelines(f"CRITICAL flood {n}.{k}\n" for k in range(50))
            await asyncio.sleep(0.02)
        await until(lambda: counted(engine, 2_200))
        events = await engine.events.read()
    (notice,) = [e for e in events if e.kind == "notification" and e.key == "error-log"]
    assert notice.data["text"] == "200 error lines in the logs (ERROR 200)"
    assert [q["text"] for q in notice.data["quoted"]][-3:] == \
        ["ERROR number 197", "ERROR number 198", "ERROR number 199"]
    assert len(events) < 30, [e.kind for e in events]


async def test_a_sustained_flood_sends_one_bounded_digest_per_interval(
    tmp_path: Path,
) -> None:
    """Fault 13: while matches go on, one digest every digest_every_s with the lines held
    back since the last one, counted per pattern; its text stays bounded however long the
    lines and however many patterns."""
    log = tmp_path / "app.log"
    log.write_text("")
    patterns = tuple(f"E{n:02d}" for n in range(20))
    clock = ManualClock()
    engine = Engine(tmp_path / "home", clock=clock, survival=SurvivalConfig(
        error_log=ErrorLogPolicy(files=(str(log),), patterns=patterns, digest_every_s=60,
                                 max_line_bytes=16_384)))
    await engine.open()
    try:
        await engine.step()
        for second in range(0, 185, 5):  # a flood for 3 minutes, sampled every 5 s
            with log.open("a") as out:
                out.writelines(f"{p} {'x' * 10_000} at {second}\n" for p in patterns)
            clock.advance(5_000)
            await engine.step()
        sent = await engine.events.read(kinds=["notification"])
        texts = [e.data["text"] for e in sent]
    finally:
        await engine.close()
    assert len(texts) == 4  # at once, then after 60, 120 and 180 s
    assert all(sum(len(q["text"]) for q in e.data["quoted"]) < 2_000 for e in sent)
    assert texts[0].startswith("20 error lines in the logs (E00 1, E01 1, ")
    assert texts[1].startswith("240 error lines in the logs (E00 12, E01 12, ")
    assert all(text.endswith(", 12 more patterns)") for text in texts)
    assert all(len(text) < 1_000 for text in texts)


async def has_sample(engine: Engine, key: str) -> bool:
    return key in await engine.vitals.latest([key])


async def notices(engine: Engine, at_least: int) -> bool:
    found = [e for e in await engine.events.read(kinds=["notification"]) if e.key == "error-log"]
    return len(found) >= at_least


async def counted(engine: Engine, lines: int) -> bool:
    samples = await engine.vitals.window("error-log", 0)
    return sum(s.data["matches"] for s in samples if s.ok) >= lines


# -- 14 and 20: the config check catches what broke later ---------------------------------------


def test_an_invalid_error_log_pattern_is_refused_by_the_config_check() -> None:
    """Fault 14: an invalid regex passed the config check, then `upulse tick` and `daemon
    start` died with an re.error traceback."""
    with pytest.raises(SurvivalConfigError) as caught:
        load_config({"error_log": {"patterns": ["ERROR", "(unclosed"]}})
    assert str(caught.value).startswith(
        "survival.error_log.patterns[1] = '(unclosed' is not a valid regular expression: "
        "missing ), unterminated subpattern")
    with pytest.raises(SurvivalConfigError, match=r"patterns\[0\] = '\\ud800'"):
        load_config({"error_log": {"patterns": ["\ud800"]}})


@pytest.mark.parametrize("timeout", [0, -1, 1e308, 61])
def test_a_webhook_timeout_out_of_bounds_is_refused(timeout: float) -> None:
    """Fault 20: notify.webhook_timeout_s <= 0 or 1e308 passed the config check."""
    with pytest.raises(SurvivalConfigError, match=r"survival\.notify\.webhook_timeout_s = .* "
                                                  r"is outside its hard bounds \[0\.1, 60\]"):
        load_config({"notify": {"webhook_timeout_s": timeout}})


@pytest.mark.parametrize(("url", "shown"), [
    ("file:///etc/passwd", "not file://"),
    ("ftp://user:pw@files.example/drop", "not ftp://files.example"),
    ("https:///no-host/T0KEN", "not https://"),
    ("hooks.example/T0KEN", "not a URL without a scheme"),
])
def test_a_webhook_url_that_is_not_http_with_a_host_is_refused(url: str, shown: str) -> None:
    """Fault 20: a file:// webhook URL passed the config check."""
    with pytest.raises(SurvivalConfigError) as caught:
        load_config({"notify": {"webhook_url": url}})
    assert str(caught.value) == (
        f"survival.notify.webhook_url must be an http:// or https:// URL with a host, "
        f"{shown} — the webhook is POSTed over HTTP")
    assert load_config({"notify": {"webhook_url": "https://hooks.example/T0KEN?k=1",
                                   "webhook_timeout_s": 60}}).notify.webhook_timeout_s == 60


# -- 6: a failing webhook's error does not carry its URL ---------------------------------------


class Refusing(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def refusing_server() -> Iterator[int]:
    """A loopback HTTP server answering 403 to every POST; yields its port."""
    server = LoopbackServer()
    server.serve(Refusing)
    try:
        yield server.port
    finally:
        server.shutdown()


@pytest.mark.parametrize("answer", ["http-403", "unreachable"])
async def test_a_failing_webhook_is_named_by_scheme_and_host_only(
    tmp_path: Path, refusing_server: int, answer: str
) -> None:
    """Fault 6 (the notify executor's side): the webhook's HTTP error put the full URL (path
    token, query key, basic-auth password) into the effect-failed error in events.db."""
    port = refusing_server if answer == "http-403" else unused_port()
    url = f"http://hook-user:pa55word@{LOOPBACK}:{port}/hooks/T0KEN?key=S3CRET"
    engine = Engine(tmp_path / "home", survival=SurvivalConfig(
        notify=NotifySinks(webhook_url=url, webhook_timeout_s=2)))
    await engine.open()
    try:
        await engine.events.append([effect_draft(
            Notify(topic="t", level="warning", text="hello"), "survival")])
        await engine.executor_loop.run_until_idle()
        (failed,) = await engine.events.read(kinds=["effect-failed"])
    finally:
        await engine.close()
    error = failed.data["error"]
    assert error.startswith(f"pulse_survival.executors.notify.WebhookFailed: notify webhook "
                            f"http://{LOOPBACK}:{port} ")
    assert ("answered HTTP 403 Forbidden" if answer == "http-403" else
            "could not be reached (ConnectError)") in error
    for secret in ("hook-user", "pa55word", "T0KEN", "S3CRET", "/hooks", "for url"):
        assert secret not in error


def unused_port() -> int:
    """A loopback port nothing listens on."""
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


async def test_the_logs_and_notice_files_the_survival_layer_creates_are_private(
    tmp_path: Path,
) -> None:
    """Fault 8 (the survival layer's share): a restarted process's log and the notify log
    file were created with the umask (0644), though they hold process output and notices."""
    store = await SqliteEventStore.open(tmp_path / "events.db")
    ctx = ExecutionContext(effect_id="e-1", attempt=1, seq=1, origin="survival",
                           clock=SystemClock(), events=store)
    previous = os.umask(0o022)
    try:
        await RestartProcessExecutor(tmp_path / "logs").execute(
            RestartProcess(name="brief", argv=(sys.executable, "-c", "print('up')")), ctx)
        sinks = NotifySinks(log_file=str(tmp_path / "notices" / "notices.log"))
        await NotifyExecutor(sinks).execute(Notify(topic="t", level="info", text="x"), ctx)
    finally:
        os.umask(previous)
        await store.close()
    for made in (tmp_path / "logs" / "brief.log", tmp_path / "notices" / "notices.log"):
        assert stat.S_IMODE(made.stat().st_mode) == 0o600, made
    for folder in (tmp_path / "logs", tmp_path / "notices"):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700, folder


async def test_a_fifo_as_the_notify_log_file_is_refused_without_blocking(
    tmp_path: Path,
) -> None:
    """Fault 3 (the notify executor's share): a FIFO named as the notify log file blocked a
    thread of the shared pool for good (and the process could not exit)."""
    fifo = tmp_path / "notices.log"
    os.mkfifo(fifo)
    store = await SqliteEventStore.open(tmp_path / "events.db")
    ctx = ExecutionContext(effect_id="e-1", attempt=1, seq=1, origin="survival",
                           clock=SystemClock(), events=store)
    try:
        with pytest.raises(PulseError, match=r"is not a regular file|cannot be opened"):
            async with asyncio.timeout(5):
                await NotifyExecutor(NotifySinks(log_file=str(fifo))).execute(
                    Notify(topic="t", level="info", text="x"), ctx)
    finally:
        await store.close()
