"""The hermes layer and plugin under hostile conditions, in process (Hermes' own PluginManager,
real stores in tmp_path): a locked pulse home costs a turn no more than one bounded wait, a
notice the turn stopped waiting for is not lost, a store failure mid-claim loses no notice,
kanban hooks racing from two processes both land, no Hermes the layer starts may pip-install,
and flags that would break a run are refused as settings."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import importlib
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pulse_adapters.agents import AgentStream
from pulse_adapters.hermes import (
    HermesPlugin,
    HermesRun,
    HermesSettingsError,
    KanbanTransition,
    NoticeFollower,
    PluginSettings,
    PulseBridge,
    TranscriptIngest,
    build_hermes,
    hermes_program,
    load_settings,
    plugin_settings,
)
from pulse_adapters.hermes._kanban import mirror
from pulse_adapters.hermes._notices import NOTICE_OFFERED, notice_line
from pulse_core import (
    Engine,
    EventStore,
    LayerContext,
    Principal,
    StoreError,
    SystemClock,
    TaskBoard,
    VersionConflict,
)
from pulse_core import open_home as open_pulse_home
from pulse_core._effects import effect_draft
from pulse_core.store import reveal
from pulse_survival.effects import Notify
from tests.adapters.hermes.rig import eventually, read_events

TEST_TIME_LIMIT_S = 60


def plugin_in_hermes(plugin: HermesPlugin, hermes_home: Path) -> Any:
    """`plugin` registered on a fresh Hermes PluginManager (whose invoke_hook Hermes calls)."""
    plugins: Any = importlib.import_module("hermes_cli.plugins")
    manager = plugins.PluginManager()
    ctx = plugins.PluginContext(plugins.PluginManifest(name="pulse", source="entrypoint",
                                                       key="pulse"), manager)
    plugin.register(ctx)
    return manager


def turn(manager: Any, session: str, text: str) -> tuple[list[Any], float]:
    """One Hermes turn's hooks, as turn_context and turn_finalizer fire them: what
    pre_llm_call returned, and the seconds the hooks held the agent's thread."""
    started = time.perf_counter()
    manager.invoke_hook("on_session_start", session_id=session, platform="cli")
    offered = manager.invoke_hook("pre_llm_call", session_id=session, user_message=text,
                                  platform="cli", sender_id="")
    manager.invoke_hook("post_llm_call", session_id=session, assistant_response="ok",
                        platform="cli")
    manager.invoke_hook("on_session_end", session_id=session, completed=True,
                        interrupted=False, platform="cli")
    return offered, time.perf_counter() - started


async def new_home(home: Path, *notices: str) -> None:
    """A pulse home holding a pending Notify for each of `notices`."""
    stores = await open_pulse_home(home)
    try:
        for text in notices:
            await stores.events.append([effect_draft(
                Notify(topic="disk", level="warning", text=text), origin="survival")])
    finally:
        await stores.close()


@pytest.fixture
def hermes_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "hermes"
    home.mkdir()
    monkeypatch.setenv("HERMES_HOME", str(home))
    return home



@pytest.fixture
def locked_home(tmp_path: Path) -> Iterator[Path]:
    """A pulse home whose event log another process holds the write lock of."""
    home = tmp_path / "pulse"
    asyncio.run(new_home(home, "disk /srv is 97% full"))
    holder = sqlite3.connect(home / "events.db", isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        yield home
    finally:
        holder.close()


def test_a_locked_pulse_home_costs_hermes_one_bounded_wait_not_one_per_turn(
        hermes_home: Path, locked_home: Path) -> None:
    settings = PluginSettings(home=str(locked_home), notice_wait_s=0.3, flush_wait_s=1.0)
    plugin = HermesPlugin(settings)
    manager = plugin_in_hermes(plugin, hermes_home)
    try:
        held = [turn(manager, "s-1", f"turn {n}")[1] for n in range(4)]
    finally:
        started = time.perf_counter()
        plugin.close()
        closing = time.perf_counter() - started
    print("turns on a locked home:", ", ".join(f"{s:.2f} s" for s in held),
          f"; close {closing:.2f} s")
    assert held[0] < settings.notice_wait_s + settings.flush_wait_s + 10  # bounds a hang
    # the plugin knows it is behind: it stops waiting (a wait at all lasts at least this)
    assert max(held[1:]) < min(settings.notice_wait_s, plugin.bridge.stall_s)
    assert closing < plugin.bridge.stall_s + 10  # one slice in which nothing moved; a hang


def test_a_bridge_closed_before_its_home_opened_says_so_not_that_the_home_fails(
        locked_home: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Closed while the home's lock keeps it from opening, the bridge stops waiting and
    cancels the opening. That is no failed opening, to be tried again."""
    bridge = PulseBridge(locked_home, principal=Principal.agent("hermes", "cli"),
                         name="hermes-plugin", stall_s=0.2)
    bridge.start()
    with caplog.at_level(logging.INFO, logger="pulse.hermes"):
        bridge.close(0.5)
        assert bridge.mode == "opening"  # the home never opened: the lock is still held
    said = [(r.levelno, r.getMessage()) for r in caplog.records]
    assert not [text for level, text in said if level >= logging.ERROR], said
    assert any(f"closed before the pulse home {locked_home} opened" in text
               for _, text in said), said


def test_jobs_a_closing_bridge_gives_up_on_are_dropped_without_noise_on_the_host(
        locked_home: Path, caplog: pytest.LogCaptureFixture,
        recwarn: pytest.WarningsRecorder) -> None:
    """A home that does not move at close: the opening and the jobs queued behind it are
    cancelled and the bridge's loop closed, so nothing is left for the host's exit to tear
    down ("Task was destroyed but it is pending!", "coroutine ... was never awaited")."""
    bridge = PulseBridge(locked_home, principal=Principal.agent("hermes", "cli"),
                         name="hermes-plugin", stall_s=0.2)
    bridge.start()

    async def job(events: EventStore) -> None:
        await events.append([])

    for n in range(3):
        bridge.submit(job, f"job {n}")
    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        bridge.close(0.5)
        assert bridge.mode == "opening"  # the lock is still held: close gave up
        del bridge
        gc.collect()
    torn = [r.getMessage() for r in caplog.records if r.name == "asyncio"]
    assert not torn, torn
    unawaited = [str(w.message) for w in recwarn if "never awaited" in str(w.message)]
    assert not unawaited, unawaited


def settle(plugin: HermesPlugin, timeout_s: float = 60.0) -> None:
    """Wait until every job handed to the plugin's bridge has ended."""
    deadline = time.monotonic() + timeout_s
    while not plugin.bridge.flush(0.05):
        assert time.monotonic() < deadline, "the bridge did not catch up"
        time.sleep(0.05)


def test_a_notice_the_turn_stopped_waiting_for_is_left_for_the_next_process(
        hermes_home: Path, tmp_path: Path) -> None:
    home = tmp_path / "pulse"
    asyncio.run(new_home(home, "disk /srv is 97% full"))
    settings = PluginSettings(home=str(home), embed=False, notice_wait_s=0.2)
    first = HermesPlugin(settings)
    manager = plugin_in_hermes(first, hermes_home)
    home_answers = threading.Event()

    async def slow(events: EventStore) -> None:  # a slow home: the turn's claim runs after
        await asyncio.to_thread(home_answers.wait, 60)  # the turn stopped waiting for it

    first.bridge.submit(slow, "slow")
    offered, _ = turn(manager, "s-1", "hello")
    home_answers.set()
    assert offered == []
    settle(first)
    first.close()  # a one-shot Hermes exits here: a claim it made now would reach no one
    second = HermesPlugin(settings)
    later = plugin_in_hermes(second, hermes_home)
    try:
        offered, _ = turn(later, "s-2", "hello again")
    finally:
        second.close()
    assert len(offered) == 1 and "disk /srv is 97% full" in offered[0]["context"]
    claims = [e for e in asyncio.run(read_events(home)) if e.kind == NOTICE_OFFERED]
    assert [e.data["session"] for e in claims] == ["s-2"]


class FailingAppends:
    """An EventStore whose next `fail` appends raise StoreError (a full disk, a dead store)."""

    def __init__(self, events: EventStore, fail: int) -> None:
        self.events, self.fail = events, fail

    def __getattr__(self, name: str) -> Any:
        return getattr(self.events, name)

    async def append(self, drafts: Any, **kwargs: Any) -> Any:
        if self.fail > 0:
            self.fail -= 1
            raise StoreError("database or disk is full")
        return await self.events.append(drafts, **kwargs)


async def test_a_store_failure_while_claiming_loses_no_notice(tmp_path: Path) -> None:
    async with Engine(tmp_path / "pulse") as engine:
        follower = NoticeFollower(["notify"], max_age_ms=60_000)
        assert await follower.claim(engine.events, engine.clock.now_ms()) == []
        for text in ("one", "two"):
            await engine.append([effect_draft(Notify(topic="t", level="warning", text=text),
                                              origin="survival")])
        flaky: Any = FailingAppends(engine.events, fail=1)
        try:
            first = await follower.claim(flaky, engine.clock.now_ms())
        except StoreError:
            first = []
        again = await follower.claim(flaky, engine.clock.now_ms())
    assert first == []
    assert again == ["- warning (t): one", "- warning (t): two"]


class Interleaved:
    """An EventStore whose appends wait until `readers` appends are about to happen: two
    hooks in two Hermes processes that both read the task before either writes."""

    def __init__(self, events: EventStore, readers: int) -> None:
        self.events = events
        self.waiting = 0
        self.readers = readers
        self.all_read = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.events, name)

    async def append(self, drafts: Any, **kwargs: Any) -> Any:
        self.waiting += 1
        if self.waiting >= self.readers:
            self.all_read.set()
        await self.all_read.wait()
        return await self.events.append(drafts, **kwargs)


async def test_kanban_hooks_racing_from_two_processes_both_land(tmp_path: Path) -> None:
    common: dict[str, Any] = {"task_id": "k-2", "board": "default", "assignee": "coder",
                              "run_id": 3}
    async with Engine(tmp_path / "pulse") as engine:
        racing: Any = Interleaved(engine.events, readers=2)
        written = await asyncio.gather(
            mirror(racing, KanbanTransition(hook="kanban_task_claimed", **common)),
            mirror(racing, KanbanTransition(hook="kanban_task_completed", summary="done",
                                            **common)))
        task = await TaskBoard(engine.events).state("hermes:default:k-2:3")
        kinds = [e.kind for e in await engine.events.read(key="hermes:default:k-2:3")]
    assert task is not None and task.status == "closed", kinds
    assert task.result == {"summary": "done", "run_id": 3}
    assert kinds == ["task-created", "task-assigned", "task-executing", "task-acked",
                     "task-closed"]
    assert sorted(written) == [0, 5] or sorted(written) == [2, 3]


def test_no_hermes_the_layer_starts_may_pip_install(tmp_path: Path) -> None:
    context = LayerContext(tmp_path, SystemClock())
    sealed = build_hermes({"gateway": True, "home": str(tmp_path / "h")}, context)
    (gateway,) = sealed.layer.essentials
    assert gateway.env["HERMES_DISABLE_LAZY_INSTALLS"] == "1"
    assert hermes_program(sealed.settings).env["HERMES_DISABLE_LAZY_INSTALLS"] == "1"
    allowed = build_hermes({"gateway": True, "lazy_installs": True}, context)
    (gateway,) = allowed.layer.essentials
    assert "HERMES_DISABLE_LAZY_INSTALLS" not in gateway.env


@pytest.mark.parametrize("arg", ["--usage-file", "--usage-file=/tmp/x", "--usage=/tmp/x",
                                 "--ones=hi", "--mod=x"])
def test_extra_args_that_would_take_over_the_runs_flags_are_refused(arg: str) -> None:
    with pytest.raises(HermesSettingsError) as caught:
        load_settings({"extra_args": [arg]})
    assert f"setting `layers.hermes.extra_args` may not hold {arg}" in str(caught.value)
    assert load_settings({"extra_args": ["--max-turns", "5"]}).extra_args == ("--max-turns",
                                                                             "5")


KEY = "pulse-test-key-7f3a9c41d2"  # no known prefix: Hermes' own redaction does not know it


@pytest.mark.parametrize("failed", [True, False])
def test_the_model_key_never_reaches_the_task_from_what_hermes_reports(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failed: bool) -> None:
    monkeypatch.setenv("PULSE_TEST_HERMES_KEY", KEY)
    settings = load_settings({"model": {"base_url": "http://127.0.0.1:9/v1", "model": "m",
                                        "api_key_env": "PULSE_TEST_HERMES_KEY"}})
    executor = build_hermes(settings, LayerContext(tmp_path, SystemClock())).executor
    run = HermesRun(task_id="t-1", task_version=1, agent="hermes", project="p", prompt="hi")
    echoed = f"HTTP 401: Incorrect API key provided: {KEY}"
    executor.argv(run, "hermes")
    executor.usage_file(run).write_text(
        json.dumps({"failed": failed, "completed": not failed, "session_id": "s",
                    "failure": echoed if failed else None}), encoding="utf-8")
    parsed = executor.parse(run, AgentStream((echoed,), "", 0))
    assert KEY not in json.dumps([parsed.error, parsed.result])
    assert "Incorrect API key provided" in json.dumps([parsed.error, parsed.result])


async def test_a_home_that_cannot_be_opened_at_start_is_opened_once_it_can(
        tmp_path: Path) -> None:
    blocker = tmp_path / "mnt"
    blocker.write_text("not mounted yet", encoding="utf-8")  # the home's folder cannot exist
    bridge = PulseBridge(blocker / "pulse", name="hermes-plugin", reopen_after_s=0.2,
                         principal=Principal.agent("hermes", "hermes-plugin"))
    bridge.start()

    async def create(events: EventStore) -> int:
        return (await TaskBoard(events, origin="agent").create("t-1", "later")).seq

    try:
        assert await asyncio.to_thread(bridge.call, create, "write", timeout_s=60.0) is None
        assert bridge.mode == "failed"
        blocker.unlink()
        blocker.mkdir()  # mounted
        await asyncio.sleep(0.3)
        seq = await asyncio.to_thread(bridge.call, create, "write", timeout_s=60.0)
    finally:
        await asyncio.to_thread(bridge.close)
    assert seq is not None
    stores = await open_pulse_home(blocker / "pulse")
    try:
        assert await TaskBoard(stores.events).state("t-1") is not None
    finally:
        await stores.close()


def hermes_store(hermes_home: Path) -> Any:
    """Hermes' own session store (hermes_state.SessionDB) at HERMES_HOME/state.db."""
    state: Any = importlib.import_module("hermes_state")
    return state.SessionDB(hermes_home / "state.db")


async def test_a_session_ingest_took_first_is_not_recorded_again_by_the_plugin(
        hermes_home: Path, tmp_path: Path) -> None:
    db = hermes_store(hermes_home)
    db.create_session("s-1", "cli")
    db.append_message("s-1", "user", "hello")  # Hermes persists the turn's user message...
    ingest = TranscriptIngest(hermes_home, identity="owner")
    async with Engine(tmp_path / "pulse") as engine:
        assert await ingest.step(engine.events) == 1  # ...and ingest reads it at once
        plugin = HermesPlugin(PluginSettings(home=str(engine.home), embed=False, notices=()))
        manager = await asyncio.to_thread(plugin_in_hermes, plugin, hermes_home)
        await asyncio.to_thread(turn, manager, "s-1", "hello")  # the plugin's marker: late
        db.append_message("s-1", "assistant", "ok")
        await asyncio.to_thread(plugin.close)
        while await ingest.step(engine.events):
            pass
        said = [(e.data["role"], reveal(e.data["text"], engine.events.keys))
                for e in await engine.events.read(key="identity:owner")]
    db.close()
    assert said == [("human", "hello"), ("agent", "ok")]


async def test_a_session_the_plugin_marks_between_ingest_reading_and_writing_is_skipped(
        hermes_home: Path, tmp_path: Path) -> None:
    db = hermes_store(hermes_home)
    db.create_session("s-2", "cli")
    db.append_message("s-2", "user", "hi")
    ingest = TranscriptIngest(hermes_home, identity="owner")
    async with Engine(tmp_path / "pulse") as engine:
        plugin = HermesPlugin(PluginSettings(home=str(engine.home), embed=False, notices=()))
        manager = await asyncio.to_thread(plugin_in_hermes, plugin, hermes_home)
        marked: Any = MarksFirst(engine.events, lambda: asyncio.to_thread(
            turn, manager, "s-2", "hi"))
        with contextlib.suppress(VersionConflict):
            await ingest.step(marked)  # reads the session unmarked; the plugin marks it
        while await ingest.step(engine.events):
            pass
        await asyncio.to_thread(plugin.close)
        said = [(e.data["role"], reveal(e.data["text"], engine.events.keys))
                for e in await engine.events.read(key="identity:owner")]
    db.close()
    assert said == [("human", "hi"), ("agent", "ok")]


class MarksFirst:
    """An EventStore that runs `before` ahead of its first append."""

    def __init__(self, events: EventStore, before: Any) -> None:
        self.events, self.before = events, before

    def __getattr__(self, name: str) -> Any:
        return getattr(self.events, name)

    async def append(self, drafts: Any, **kwargs: Any) -> Any:
        if self.before is not None:
            before, self.before = self.before, None
            await before()
        return await self.events.append(drafts, **kwargs)


def test_one_wrong_plugin_setting_does_not_move_the_plugin_to_another_home(
        caplog: pytest.LogCaptureFixture) -> None:
    entry = {"home": "/srv/pulse", "identity": "ana", "notice_wait_s": "fast", "bogus": 1}
    settings = plugin_settings(entry, {})
    assert (settings.home, settings.identity) == ("/srv/pulse", "ana")
    assert settings.notice_wait_s == PluginSettings().notice_wait_s
    said = caplog.text
    assert "plugins.entries.pulse.notice_wait_s" in said and "plugins.entries.pulse.bogus" in said


async def said_to(engine: Engine) -> list[tuple[str, str]]:
    return [(e.data["role"], reveal(e.data["text"], engine.events.keys))
            for e in await engine.events.read(key="identity:owner")]


async def test_a_state_db_deleted_and_made_anew_is_ingested_from_its_start(
        hermes_home: Path, tmp_path: Path) -> None:
    old = hermes_store(hermes_home)
    old.create_session("s-1", "cli")
    for text in ("one", "two", "three"):
        old.append_message("s-1", "user", text)
    old.close()
    ingest = TranscriptIngest(hermes_home, identity="owner")
    async with Engine(tmp_path / "pulse") as engine:
        assert await ingest.step(engine.events) == 3
        for name in ("state.db", "state.db-wal", "state.db-shm"):
            (hermes_home / name).unlink(missing_ok=True)
        assert await ingest.step(engine.events) == 0  # missing: nothing, and no error
        new = hermes_store(hermes_home)  # Hermes starts a new store: ids from 1 again
        new.create_session("s-2", "cli")
        new.append_message("s-2", "user", "four")
        new.append_message("s-2", "assistant", "five")
        new.close()
        while await ingest.step(engine.events):
            pass
        said = await said_to(engine)
        records = {e.data["record"] for e in await engine.events.read(key="identity:owner")}
    assert said == [("human", "one"), ("human", "two"), ("human", "three"), ("human", "four"),
                    ("agent", "five")]
    assert len(records) == 5


async def test_pruning_the_newest_session_makes_ingest_repeat_nothing(
        hermes_home: Path, tmp_path: Path) -> None:
    db = hermes_store(hermes_home)
    db.create_session("s-1", "cli")
    db.append_message("s-1", "user", "kept")
    db.create_session("s-2", "cli")
    db.append_message("s-2", "user", "pruned")
    ingest = TranscriptIngest(hermes_home, identity="owner")
    async with Engine(tmp_path / "pulse") as engine:
        assert await ingest.step(engine.events) == 2
        with sqlite3.connect(hermes_home / "state.db") as raw:
            raw.execute("DELETE FROM messages WHERE session_id = 's-2'")
        db.append_message("s-1", "user", "after")
        while await ingest.step(engine.events):
            pass
        said = await said_to(engine)
    db.close()
    assert said == [("human", "kept"), ("human", "pruned"), ("human", "after")]


def test_hermes_background_review_is_not_the_human_and_takes_no_notice(
        hermes_home: Path, tmp_path: Path) -> None:
    home = tmp_path / "pulse"
    asyncio.run(new_home(home, "disk /srv is 97% full"))
    plugin = HermesPlugin(PluginSettings(home=str(home), embed=False))
    manager = plugin_in_hermes(plugin, hermes_home)
    review: list[Any] = []
    # run_agent._spawn_background_review runs a fork of the agent on the parent's session,
    # in a thread named bg-review, every few turns: its prompt is Hermes' harness, not the user
    fork = threading.Thread(target=lambda: review.append(turn(
        manager, "s-1", "Review the conversation above and consider saving to memory...")),
        name="bg-review")
    fork.start()
    fork.join(10)
    offered, _ = turn(manager, "s-1", "what's up?")
    plugin.close()
    assert review[0][0] == []
    assert len(offered) == 1 and "disk /srv is 97% full" in offered[0]["context"]
    said = [(e.data["role"], e.data["text"]) for e in asyncio.run(read_events(home))
            if e.kind == "human-exchange"]
    assert said == [("human", "what's up?"), ("agent", "ok")]


def test_a_delegated_subagent_is_not_the_human_and_takes_no_notice(
        hermes_home: Path, tmp_path: Path) -> None:
    home = tmp_path / "pulse"
    asyncio.run(new_home(home, "disk /srv is 97% full"))
    plugin = HermesPlugin(PluginSettings(home=str(home), embed=False))
    manager = plugin_in_hermes(plugin, hermes_home)
    # tools/delegate_tool.py builds the child agent with platform="subagent"; its "user
    # message" is the goal the parent agent wrote
    manager.invoke_hook("on_session_start", session_id="child", platform="subagent")
    child = manager.invoke_hook("pre_llm_call", session_id="child", platform="subagent",
                                user_message="Find every TODO in src/", sender_id="")
    manager.invoke_hook("post_llm_call", session_id="child", platform="subagent",
                        assistant_response="3 TODOs")
    manager.invoke_hook("on_session_end", session_id="child", platform="subagent")
    offered, _ = turn(manager, "s-1", "what's up?")
    plugin.close()
    assert child == []
    assert len(offered) == 1 and "disk /srv is 97% full" in offered[0]["context"]
    said = [(e.data["role"], e.data["text"]) for e in asyncio.run(read_events(home))
            if e.kind == "human-exchange"]
    assert said == [("human", "what's up?"), ("agent", "ok")]


async def test_transcript_ingest_passes_over_subagent_sessions(hermes_home: Path,
                                                                tmp_path: Path) -> None:
    db = hermes_store(hermes_home)
    db.create_session("s-1", "cli")
    db.append_message("s-1", "user", "tidy up")
    db.create_session("child", "subagent", parent_session_id="s-1")
    db.append_message("child", "user", "Find every TODO in src/")
    db.append_message("child", "assistant", "3 TODOs")
    db.append_message("s-1", "assistant", "done")
    ingest = TranscriptIngest(hermes_home, identity="owner")
    async with Engine(tmp_path / "pulse") as engine:
        while await ingest.step(engine.events):
            pass
        said = await said_to(engine)
    db.close()
    assert said == [("human", "tidy up"), ("agent", "done")]


async def test_a_store_without_autoincrement_is_still_ingested(hermes_home: Path,
                                                               tmp_path: Path) -> None:
    with sqlite3.connect(hermes_home / "state.db") as raw:
        raw.executescript(
            "CREATE TABLE sessions (id TEXT PRIMARY KEY, source TEXT, user_id TEXT);"
            "CREATE TABLE messages (id INTEGER PRIMARY KEY, session_id TEXT, role TEXT, "
            "content TEXT);"
            "INSERT INTO sessions VALUES ('s-1', 'cli', NULL);"
            "INSERT INTO messages VALUES (1, 's-1', 'user', 'plain');")
    ingest = TranscriptIngest(hermes_home, identity="owner")
    async with Engine(tmp_path / "pulse") as engine:
        assert await ingest.step(engine.events) == 1
        assert await said_to(engine) == [("human", "plain")]


def test_a_slow_but_working_home_still_gets_what_a_one_shot_turn_recorded(
        hermes_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "pulse"
    asyncio.run(new_home(home))
    monkeypatch.setattr("sys.argv", ["hermes", "-z", "hello"])
    plugin = HermesPlugin(PluginSettings(home=str(home), embed=False, notice_wait_s=0.2))
    manager = plugin_in_hermes(plugin, hermes_home)

    async def slow(events: EventStore) -> None:
        await asyncio.sleep(0.5)  # slow, and then done: the home works

    plugin.bridge.submit(slow, "slow")
    _, held = turn(manager, "s-1", "hello")  # on_session_end closes: a one-shot's last hook
    assert held < 0.2 + 3.0 + 10  # the turn's waits are bounded: this only catches a hang
    said = [(e.data["role"], e.data["text"]) for e in asyncio.run(read_events(home))
            if e.kind == "human-exchange"]
    assert said == [("human", "hello"), ("agent", "ok")]


def test_a_notice_of_another_effect_never_shows_its_env_or_a_url_s_secrets() -> None:
    line = notice_line({"type": "restart-process", "name": "gateway",
                        "env": {"OPENAI_API_KEY": "sk-live-123"},
                        "reason": "down; hook https://u:hunter2@hooks.example.com/t?k=s3"})
    assert "sk-live-123" not in line and "OPENAI_API_KEY" not in line
    assert "hunter2" not in line and "k=s3" not in line
    assert line.startswith("- restart-process: ") and "gateway" in line


class CountedIngest(TranscriptIngest):
    """Transcript ingest that counts its steps."""

    steps = 0

    async def step(self, events: EventStore, *, host: str = "") -> int:
        self.steps += 1
        return await super().step(events, host=host)


async def test_a_corrupt_state_db_is_recorded_once_as_an_error_and_ingest_runs_on(
        tmp_path: Path) -> None:
    hermes_home = tmp_path / "hermes"
    hermes_home.mkdir()
    (hermes_home / "state.db").write_bytes(b"this is not a database\0" * 400)
    ingest = CountedIngest(hermes_home, identity="owner", interval_s=0.02)
    async with Engine(tmp_path / "pulse") as engine:
        task = asyncio.create_task(ingest(engine))
        try:
            async def recorded() -> bool:
                return bool(await engine.events.read(key="service:hermes-transcripts"))

            await eventually(recorded)
            seen = ingest.steps

            async def failed_again() -> bool:  # many more reads fail the same way
                return ingest.steps >= seen + 5

            await eventually(failed_again)
            errors = await engine.events.read(key="service:hermes-transcripts")
            assert not task.done()
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    assert len(errors) == 1, [e.data for e in errors]
    assert "not a database" in errors[0].data["message"]
    assert errors[0].data["store"] == str(hermes_home / "state.db")
