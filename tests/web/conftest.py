"""Fixtures of the web UI's whole-process tests: a real daemon with the web layer on, an
essential process its survival layer supervises, the UI's address and token as `upulse ui`
prints them, and Debian's chromium driven by Playwright (never a browser Playwright
downloads)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import httpx
import psutil
import pytest
from playwright.sync_api import Browser, BrowserContext, Page, Playwright, sync_playwright

from pulse_adapters.llm.stand_in import ChatServer
from pulse_adapters.maintenance import request_cycle
from pulse_adapters.web import ensure_token
from pulse_core import Effect, Engine, EventDraft, SqliteEventStore
from pulse_core._effects import effect_draft
from tests.cli.runner import Upulse, wait_until
from tests.cli.support import promote_without_gate, stage_new_text
from tests.timing import scaled

T = TypeVar("T")
ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = ROOT / "test-artifacts" / "web"
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ("--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync")
"""What chromium needs on a CI machine: no sandbox (it runs as root), no GPU, and nothing
that reaches for the network on its own."""
ESSENTIAL = "essential"
"""The name of the essential process in the daemon's survival config."""
LIVE_S = 30.0
"""How long a wait for something new to show on a live page may last: it bounds a hang only.
The UI's process runs niced below the engine (pulse_adapters.web's NICENESS), so beside busy
neighbours a page may take seconds to change; it must change without a reload, which the
tests check, not how soon."""
ESSENTIAL_SCRIPT = """\
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while True:
    time.sleep(0.5)
"""
CODER = "coder"
"""The cursor layer's agent in the daemon (it takes no task of these tests)."""
FAKE_AGENT = f"""#!{sys.executable}
print("2099.1.1")
"""
"""A stand-in for Cursor's `agent` program: it only says its version."""
ELSEWHERE = "another-host.invalid"
"""A host no engine here runs as: an effect bound to it stays pending in this daemon."""


class OrphanEffect(Effect, tag="web-test-orphan"):
    """An effect no executor of the daemon handles (a layer since removed from config.json
    left it in the log, say): its executor loop fails it for good at its first attempt."""

    note: str


def wait_for(probe: Callable[[], Any], timeout: float, what: str) -> Any:
    """`tests.cli.runner.wait_until`: `probe()` once truthy (AssertionError after `timeout`
    seconds, scaled: the bound of a hang), typed as what the web tests wait for."""
    return wait_until(probe, scaled(timeout), what)


def run_async(work: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """`work()` run to its end on an event loop of its own, in a thread: Playwright's sync
    API holds this thread's loop while a browser is open."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(lambda: asyncio.run(work())).result()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now. The UI gets a fixed one, not 0, so that after a
    reload (a rollback) it serves on the same port and an open page reconnects."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class WebDaemon:
    """A home whose daemon runs the web layer, with one essential process it supervises."""

    def __init__(self, root: Path, chat: ChatServer) -> None:
        self.root = root
        self.chat = chat
        self.agent = root / "agent"
        self.upulse = Upulse(root)
        self.home = root / "home"
        self.pidfile = root / "essential.pid"
        self.script = root / "essential.py"
        self.first: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.token = ""

    # -- set-up and teardown --------------------------------------------------------------

    def start(self, port: int) -> None:
        """Initialise the home (the web layer on `port`, a fast tick, the essential process,
        one promote to roll back), start the essential process and the daemon, and wait for
        the UI to serve and the essential process to be RUNNING."""
        self.upulse.init(self.home)
        self.script.write_text(ESSENTIAL_SCRIPT)
        config = json.loads((self.home / "config.json").read_text())
        self.agent.write_text(FAKE_AGENT)
        self.agent.chmod(0o755)
        config["layers"] = {
            "web": {"port": port, "live_every_s": 0.2},
            # layers whose pages the browser opens; none acts during the tests
            "awareness": {"base_url": self.chat.base_url, "model": "stand-in",
                          "review": {"initial_delay_s": 3600}},
            "maintenance": {},
            "cursor": {"program": str(self.agent), "agents": [
                {"name": CODER, "repo": str(self.root), "projects": ["not-in-these-tests"]}]},
        }
        config["survival"] = {
            "resource_interval_s": 1,
            "processes": [{"name": ESSENTIAL, "argv": [sys.executable, str(self.script)],
                           "pidfile": str(self.pidfile)}],
            # a restart after a failed start waits 4 s: long enough to be seen in BACKOFF
            "process": {"startsecs": 1, "backoff_initial_s": 2},
        }
        (self.home / "config.json").write_text(json.dumps(config))
        run_async(self._promote)
        self.first = subprocess.Popen([sys.executable, str(self.script)],
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        self.pidfile.write_text(f"{self.first.pid}\n")
        self.upulse("daemon", "start", "--home", self.home)
        ui = wait_for(self._ui, 30, "`upulse ui` to give the UI's address")
        self.url, self.token = ui["url"], ui["token"]
        wait_for(lambda: self.process_state() == "RUNNING", 30,
                 "the essential process to be RUNNING on the UI's Processes page")

    async def _promote(self) -> None:
        """A promote (by hand, without the gate: the gate is tested elsewhere), so that a
        rollback has a revision to go back to."""
        stage_new_text(self.home / "staging")
        events = await SqliteEventStore.open(self.home / "events.db")
        try:
            await promote_without_gate(self.home, events)
        finally:
            await events.close()

    def _ui(self) -> dict[str, str] | None:
        done = self.upulse("ui", "--home", self.home, "--json", ok=False)
        return json.loads(done.stdout) if done.returncode == 0 else None

    def stop(self, keep_as: str) -> None:
        """Stop the daemon (SIGKILL if it will not), every essential process it or the test
        started, and keep daemon.log as test-artifacts/web/`keep_as`-daemon.log."""
        try:
            self.upulse.stop_all()
        finally:
            for pid in self._essential_pids():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            if self.first is not None:
                self.first.kill()
                self.first.wait(timeout=10)
            log = self.home / "daemon.log"
            if log.exists():
                ARTIFACTS.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(log, ARTIFACTS / f"{keep_as}-daemon.log")

    def _essential_pids(self) -> list[int]:
        """Every live process running this daemon's essential script (the first one and
        those the survival layer restarted, in sessions of their own)."""
        found = []
        for proc in psutil.process_iter(["cmdline"]):
            with contextlib.suppress(psutil.Error):
                if str(self.script) in (proc.info["cmdline"] or ()):
                    found.append(proc.pid)
        return found

    # -- looking at it --------------------------------------------------------------------

    def bearer(self) -> dict[str, str]:
        """The header a program sends."""
        return {"authorization": f"Bearer {self.token}"}

    def opener(self, path: str = "") -> str:
        """The address that opens page `path` ('', 'events', 'vitals?key=k') with the
        token."""
        return f"{self.url}{path}{'&' if '?' in path else '?'}token={self.token}"

    def overview(self) -> dict[str, Any]:
        """GET /api/overview, with the token."""
        response = httpx.get(self.url + "api/overview", headers=self.bearer(), timeout=10)
        response.raise_for_status()
        found = response.json()
        assert isinstance(found, dict)
        return found

    def process_state(self) -> str | None:
        """The essential process's state on the survival layer's page."""
        response = httpx.get(self.url + "api/pages/processes", headers=self.bearer(),
                             timeout=10)
        response.raise_for_status()
        for process in response.json()["processes"]:
            if process["name"] == ESSENTIAL:
                return str(process["state"])
        return None

    def essential_pid(self) -> int:
        """The pid in the essential process's pidfile (the survival layer rewrites it)."""
        return int(self.pidfile.read_text().split()[0])

    def events(self, *kinds: str, key: str | None = None) -> list[dict[str, Any]]:
        """`upulse events --json` of `kinds` (of `key`), as the CLI prints them."""
        args: list[str | Path] = ["events", "--home", self.home, "--limit", "0"]
        for kind in kinds:
            args += ["--kind", kind]
        if key is not None:
            args += ["--key", key]
        found = self.upulse.json(*args)
        assert isinstance(found, list)
        return found

    def append_effect(self, effect: Effect, *, host: str = "") -> str:
        """Append `effect` to the daemon's log as an agent does (another writer); its id."""
        async def append() -> str:
            events = await SqliteEventStore.open(self.home / "events.db")
            try:
                done = await events.append([effect_draft(effect, "agent", host=host)])
            finally:
                await events.close()
            return done.events[0].key

        return run_async(append)

    def request_maintenance(self, reason: str) -> None:
        """Ask the daemon's maintenance layer for a cycle, as an agent does."""
        async def append() -> None:
            events = await SqliteEventStore.open(self.home / "events.db")
            try:
                await request_cycle(events, reason)
            finally:
                await events.close()

        run_async(append)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
           ) -> Iterator[WebDaemon]:
    """One daemon with the web layer on for the whole module (tests share it where they do
    not disturb each other)."""
    with ChatServer() as chat:
        web = WebDaemon(tmp_path_factory.mktemp("web"), chat)
        try:
            web.start(free_port())
            yield web
        finally:
            web.stop(request.module.__name__.rpartition(".")[2])


@pytest.fixture(scope="module")
def playwright() -> Iterator[Playwright]:
    if not CHROMIUM.exists():
        pytest.fail(f"the web UI's tests need Debian's chromium at {CHROMIUM}: `./dev test` "
                    "installs it (apt-get install --no-install-recommends chromium)")
    with sync_playwright() as driver:
        yield driver


@pytest.fixture(scope="module")
def browser(playwright: Playwright) -> Iterator[Browser]:
    """Headless chromium; Playwright gives it a fresh user-data-dir of its own."""
    launched = playwright.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                          args=list(CHROMIUM_ARGS))
    try:
        yield launched
    finally:
        launched.close()


@pytest.fixture
def context(browser: Browser) -> Iterator[BrowserContext]:
    """A context of its own for each test: no cookie from another test."""
    fresh = browser.new_context(viewport={"width": 1280, "height": 900})
    fresh.set_default_timeout(scaled(LIVE_S) * 1000)  # the niced UI's pages: a hang's bound
    try:
        yield fresh
    finally:
        fresh.close()


@pytest.fixture
def page(context: BrowserContext) -> Iterator[Page]:
    """A page of the test's context; a script error it raises fails the test."""
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    yield opened
    assert not errors, f"the page's scripts raised: {errors}"


@pytest.fixture
def screenshot(request: pytest.FixtureRequest) -> Callable[[Page, str], Path]:
    """Save `page` as test-artifacts/web/<test>-<name>.png; its path."""
    def save(page: Page, name: str) -> Path:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTIFACTS / f"{request.node.name}-{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    return save


class UiProcess:
    """The UI's own process (`python -m pulse_adapters.web`, as the web service starts it) on
    a home of its own, given its settings on stdin the way the service gives them, its file
    limit (RLIMIT_NOFILE) lowered to `files` when given, its stderr written to the file
    `stderr` when given. Other writers append to the home's log as the engine would."""

    def __init__(self, home: Path, settings: dict[str, Any], files: int | None = None,
                 stderr: Path | None = None) -> None:
        self.home = home
        self.settings = settings
        self.files = files
        self.stderr = stderr
        self.process: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.token = ""

    def start(self) -> None:
        """Make the home, start the process, and wait for the address it serves."""
        async def make_home() -> None:
            async with Engine(self.home):
                pass

        run_async(make_home)
        self.token = ensure_token(self.home)
        with contextlib.ExitStack() as opened:
            err = None if self.stderr is None else opened.enter_context(self.stderr.open("ab"))
            self.process = subprocess.Popen(self._argv(), stdin=subprocess.PIPE,
                                            stdout=subprocess.PIPE, stderr=err)
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({
            "home": str(self.home), "store": None, "placement": "",
            "settings": self.settings}).encode() + b"\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], 30)
        assert ready, "the UI's process printed no address within 30 s"
        self.url = json.loads(self.process.stdout.readline())["url"]

    def _argv(self) -> list[str]:
        """`python -m pulse_adapters.web`, its file limit set first when `files` is given."""
        if self.files is None:
            return [sys.executable, "-m", "pulse_adapters.web"]
        return [sys.executable, "-c", "import resource, runpy; resource.setrlimit("
                f"resource.RLIMIT_NOFILE, ({self.files}, {self.files})); "
                "runpy.run_module('pulse_adapters.web', run_name='__main__')"]

    def stop(self) -> None:
        """End the process as the service does: its stdin closed, then SIGKILL."""
        if self.process is None:
            return
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()

    def bearer(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}

    def host(self) -> str:
        """The Host header the UI answers to."""
        return self.url.removeprefix("http://").rstrip("/")

    def append(self, *drafts: EventDraft) -> None:
        """Append `drafts` to the home's log, as the engine's process would."""
        async def append() -> None:
            events = await SqliteEventStore.open(self.home / "events.db")
            try:
                await events.append(list(drafts))
            finally:
                await events.close()

        run_async(append)
