"""A PostgreSQL commit whose reply is lost: the connection drops once the server has the
COMMIT, and the server cannot be asked at once whether it committed. The tick that asked for
it is completed with the same drafts, never run again: each effect it decided is recorded
once (the documented "pay once per ctx.effect_id" holds), and so is each error report kept
through an outage whose late append loses its reply, and each count of those not kept. And a
commit cut off before the server had its COMMIT counts as stored only if its own first event
sits at its seq, not another writer's; once its server session has ended it is known not
stored, and sent again."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from pulse_adapters.agents import AgentResult, AgentRun, AgentSpec, AgentStream, TaskDispatcher
from pulse_adapters.awareness import AwarenessConfig, AwarenessLedger, build_reviewer
from pulse_adapters.hermes import NoticeFollower
from pulse_adapters.llm.stand_in import ChatServer, RecordedRequest
from pulse_core import (
    AppendOutcomeUnknown,
    Backoff,
    Decision,
    Effect,
    EffectOutcome,
    Engine,
    EventDraft,
    ExecutionContext,
    Executor,
    Inner,
    Instruments,
    LayerContext,
    ManualClock,
    MemoryBoard,
    Snapshot,
    StoreUnavailable,
    SystemClock,
    TaskBoard,
    _error_reports,
    effect_draft,
)
from pulse_core._events import error_draft
from pulse_core.store import open_event_store
from pulse_survival.effects import Notify
from tests.adapters.agents.rig import ScriptExecutor, ScriptRun
from tests.adapters.awareness_rig import reply, settings
from tests.faults.test_pg_stall import StallingProxy, database, proxy, within
from tests.faults.test_store_outage import until
from tests.servers import PostgresServer

__all__ = ["proxy"]  # the fixture, shared with the stall tests

TEST_TIME_LIMIT_S = 120


class Pay(Effect, tag="test-pay"):
    to: str
    cents: int


async def pay_on_first_tick(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    effects, tick_ms = await inner(prev, curr)
    if curr.number == 1:
        effects = [*effects, Pay(to="ada", cents=500)]
    return Decision(effects, tick_ms)


class Payer(Executor):
    """Pays once per effect id (as the documented example does)."""

    handles = (Pay,)

    def __init__(self) -> None:
        self.paid: set[str] = set()

    async def execute(self, effect: Pay, ctx: ExecutionContext) -> None:
        self.paid.add(ctx.effect_id)


async def test_a_tick_whose_commit_reply_is_lost_records_its_effects_once(
        tmp_path: Path, postgres_server: PostgresServer, proxy: StallingProxy) -> None:
    name = database(postgres_server)
    payer = Payer()
    engine = Engine(tmp_path / "home", store=proxy.url(name, connect_timeout="1"),
                    rules=[pay_on_first_tick], executors=[payer], default_tick_ms=100)
    await engine.open()  # its loops not started: the test ticks it
    try:
        # The server commits tick 1; its reply is lost, and the look at the log that would
        # tell finds no server either (the proxy refuses new connections meanwhile).

        proxy.lose_next()
        with pytest.raises(AppendOutcomeUnknown, match="may or may not be stored"):
            await within(60, "the tick whose reply is lost", engine.tick())
        assert proxy.cuts == 1
        proxy.refusing = False
        # The effect the server did store runs meanwhile (it is no longer pending).
        await within(60, "the stored effect's run", engine.executor_loop.run_until_idle())
        assert len(payer.paid) == 1
        await within(60, "the tick once the server answers", _tick(engine))
        await within(60, "one more tick", engine.tick())
        pays = [e for e in await engine.events.read(kinds=["effect"])
                if e.data["effect"]["type"] == "test-pay"]
        ticks = [e.data["number"] for e in await engine.events.read(kinds=["tick"])]
    finally:
        await engine.close()
    assert len(pays) == 1 and len(payer.paid) == 1, ([e.key for e in pays], payer.paid)
    assert ticks.count(1) == 1, ticks


async def answer_once_logged(proxy: StallingProxy, caplog: pytest.LogCaptureFixture,
                             *texts: str) -> None:
    """Once a log line holds one of `texts` (what lost its reply is being tried again, or
    has failed), let the server be reached again: the proxy cut one commit."""

    async def logged() -> bool:
        return any(text in r.getMessage() for r in caplog.records for text in texts)

    await until(logged, 60, f"a log line holding one of {texts}")
    assert proxy.cuts == 1
    proxy.refusing = False


async def _tick(engine: Engine) -> Decision:
    while True:
        try:
            return await engine.tick()
        except StoreUnavailable:
            await asyncio.sleep(0.1)


async def test_a_commit_cut_before_the_server_had_it_is_not_taken_for_another_writers_row(
        postgres_server: PostgresServer, proxy: StallingProxy) -> None:
    name = database(postgres_server)
    direct = postgres_server.url(name)
    store = await open_event_store(proxy.url(name, connect_timeout="5"))
    other = await open_event_store(direct)
    await other.close()

    def another_writer_takes_the_seq() -> None:
        # The server side is gone, so its transaction rolled back; the seq it would have
        # had goes to another writer's event before the cut-off one is checked.
        async def write() -> None:
            writer = await open_event_store(direct)
            try:
                await writer.append([EventDraft("tick", "other", {"by": "other"})])
            finally:
                await writer.close()
        asyncio.run(write())

    try:
        await store.append([EventDraft("tick", "mine", {"by": "me", "n": 0})])
        proxy.between = another_writer_takes_the_seq
        proxy.lose_commit = True
        # Its session ended (so nothing of it can commit later) and its seq holds another
        # writer's event: not stored, so it is sent once more, after the other writer's.
        result = await within(60, "the cut-off append",
                              store.append([EventDraft("tick", "mine", {"by": "me", "n": 1})]))
        assert proxy.cuts == 1
        assert result.events[0].seq == 3
        by = [(e.seq, e.data["by"]) for e in await store.read(kinds=["tick"])]
        assert by == [(1, "me"), (2, "other"), (3, "me")]
    finally:
        await store.close()


async def pay_and_break_on_first_tick(prev: Snapshot, curr: Snapshot, inner: Inner
                                      ) -> Decision:
    decision = await pay_on_first_tick(prev, curr, inner)
    if curr.number == 1:
        raise RuntimeError("broke on tick 1")
    return decision


async def test_the_errors_of_a_tick_whose_commit_reply_is_lost_are_recorded_once(
        tmp_path: Path, postgres_server: PostgresServer, proxy: StallingProxy) -> None:
    name = database(postgres_server)
    engine = Engine(tmp_path / "home", store=proxy.url(name, connect_timeout="1"),
                    rules=[pay_and_break_on_first_tick], executors=[Payer()],
                    default_tick_ms=100)
    await engine.open()  # its loops not started: the test ticks it
    try:
        proxy.lose_next()
        with pytest.raises(AppendOutcomeUnknown):
            await within(60, "the tick whose reply is lost", engine.tick())
        assert proxy.cuts == 1
        proxy.refusing = False
        await within(60, "the tick once the server answers", _tick(engine))
    finally:
        await engine.close()  # records the error reports that wait
    store = await open_event_store(postgres_server.url(name), read_only=True)
    try:
        broke = [e for e in await store.read(kinds=["error"])
                 if e.data["message"] == "broke on tick 1"]
    finally:
        await store.close()
    assert len(broke) == 1, [(e.seq, e.idem, e.data.get("late")) for e in broke]


async def test_an_error_report_whose_append_lost_its_reply_is_recorded_once(
        postgres_server: PostgresServer, proxy: StallingProxy) -> None:
    name = database(postgres_server)
    store = await open_event_store(proxy.url(name, connect_timeout="1"))
    reports = _error_reports.ErrorReports(SystemClock())
    spawned: list[asyncio.Future[None]] = []
    reports.open(store, lambda name, work: spawned.append(asyncio.ensure_future(work)))
    try:
        await store.read(kinds=["error"])  # connected, so the report's append is the commit

        proxy.lose_next()
        reports.report("rule:r", RuntimeError("broke once"))
        with pytest.raises(StoreUnavailable, match="this error report is kept"):
            await within(60, "the report whose reply is lost", spawned[0])
        assert proxy.cuts == 1
        proxy.refusing = False
        await within(60, "the late append once the server answers", _record(reports))
        assert reports.waiting == 0
        broke = [e for e in await store.read(kinds=["error"])
                 if e.data["message"] == "broke once"]
    finally:
        await store.close()
    assert len(broke) == 1, [(e.seq, e.idem, e.data.get("late")) for e in broke]


class Outcomes(Instruments):
    """The outcome of each attempt, as the executor loop tells its instruments."""

    def __init__(self) -> None:
        self.seen: list[EffectOutcome] = []

    def executed(self, tag: str, outcome: EffectOutcome, duration_s: float) -> None:
        self.seen.append(outcome)


async def test_an_outcome_whose_commit_reply_is_lost_is_taken_as_written(
        tmp_path: Path, postgres_server: PostgresServer, proxy: StallingProxy,
        caplog: pytest.LogCaptureFixture) -> None:
    name = database(postgres_server)

    class LosesItsOutcomesReply(Payer):
        async def execute(self, effect: Pay, ctx: ExecutionContext) -> None:
            await super().execute(effect, ctx)

            proxy.lose_next()  # the next commit is the outcome's

    payer = LosesItsOutcomesReply()
    engine = Engine(tmp_path / "home", store=proxy.url(name, connect_timeout="1"),
                    rules=[pay_on_first_tick], executors=[payer], default_tick_ms=100)
    outcomes = Outcomes()
    await engine.open()  # its loops not started: the test ticks it
    try:
        engine.instruments.attach(outcomes)
        await within(60, "tick 1", engine.tick())
        running = asyncio.ensure_future(engine.executor_loop.run_until_idle())

        await answer_once_logged(proxy, caplog, "retrying while its lease holds")
        await within(60, "the executor loop once the server answers", running)
        acked = await engine.events.read(kinds=["effect-acked"])
    finally:
        proxy.refusing = False
        await engine.close()
    assert len(acked) == 1 and len(payer.paid) == 1
    assert outcomes.seen == [EffectOutcome.ACKED]


async def test_error_reports_whose_late_append_lost_its_reply_are_each_counted_once(
        postgres_server: PostgresServer, proxy: StallingProxy) -> None:
    name = database(postgres_server)
    store = await open_event_store(proxy.url(name, connect_timeout="1"))
    reports = _error_reports.ErrorReports(SystemClock())
    reports.limit = 2
    reports.open(store, lambda name, work: asyncio.ensure_future(work))

    def reports_made(first: int, count: int) -> None:  # as the store refused them
        reports.keep([error_draft(f"rule:r{n}", RuntimeError(f"broke {n}"))
                      for n in range(first, first + count)])

    try:
        reports_made(0, 5)  # 2 kept, 3 only counted

        proxy.lose_next()
        with pytest.raises(AppendOutcomeUnknown):
            await within(60, "the late append whose reply is lost", reports.record_waiting())
        assert proxy.cuts == 1
        reports_made(5, 2)  # counted after the append that may be stored
        assert reports.waiting == 2 + 3 + 2
        proxy.refusing = False
        await within(60, "the late append once the server answers", _record(reports))
        assert reports.waiting == 0
        errors = await store.read(kinds=["error"])
    finally:
        await store.close()
    counts = [e.data["not_kept"] for e in errors if e.key == _error_reports.NOT_KEPT]
    kept = [e.data["message"] for e in errors if e.key != _error_reports.NOT_KEPT]
    assert kept == ["broke 0", "broke 1"]
    assert counts == [3, 2], counts  # the stored count, then the one made after it


async def test_reports_counted_while_their_count_is_appended_get_a_count_of_their_own(
        postgres_server: PostgresServer, proxy: StallingProxy) -> None:
    name = database(postgres_server)
    store = await open_event_store(proxy.url(name))
    clock = ManualClock()
    reports = _error_reports.ErrorReports(clock)
    reports.limit = 1
    reports.open(store, lambda name, work: asyncio.ensure_future(work))

    def made(n: int) -> None:
        reports.keep([error_draft("rule:r", RuntimeError(f"broke {n}"))])
        clock.advance(1_000)

    try:
        await store.read(kinds=["error"])  # connected: the append below only waits
        first = clock.now_ms()
        for n in range(3):
            made(n)  # one kept, two counted
        proxy.pause()
        appending = asyncio.ensure_future(reports.record_waiting())
        await asyncio.sleep(0)  # it takes what waits, and its append waits on the proxy
        later = clock.now_ms()
        made(3)
        made(4)
        assert reports.waiting == 5
        proxy.resume()
        await within(60, "the late append", appending)
        assert reports.waiting == 2
        await within(60, "the second late append", reports.record_waiting())
        errors = await store.read(kinds=["error"])
    finally:
        proxy.resume()
        await store.close()
    counts = [(e.data["not_kept"], e.data["reported_at"]) for e in errors
              if e.key == _error_reports.NOT_KEPT]
    assert counts == [(2, first + 1_000), (2, later)]


async def _record(reports: _error_reports.ErrorReports) -> None:
    while True:
        try:
            return await reports.record_waiting()
        except StoreUnavailable:
            await asyncio.sleep(0.1)


async def test_a_task_whose_ack_lost_its_commit_reply_is_closed_once_not_run_again(
        tmp_path: Path, postgres_server: PostgresServer, proxy: StallingProxy,
        caplog: pytest.LogCaptureFixture) -> None:
    name = database(postgres_server)

    class LosesTheAcksReply(ScriptExecutor):
        def parse(self, run: AgentRun, stream: AgentStream) -> AgentResult:
            proxy.lose_next()  # the next commit is the task's ack
            return super().parse(run, stream)

    executor = LosesTheAcksReply(tmp_path / "pids")
    dispatcher = TaskDispatcher(ScriptRun, [AgentSpec(name="coder")], executor.policy,
                                program=executor.program)
    engine = Engine(tmp_path / "home", store=proxy.url(name, connect_timeout="1"),
                    rules=[dispatcher], executors=[executor], default_tick_ms=100)
    await engine.open()  # its loops not started: the test steps it
    try:
        await TaskBoard(engine.events).create("t-1", "say hello", prompt="ok")
        stepping = asyncio.ensure_future(engine.step())

        await answer_once_logged(proxy, caplog,
                                 "task t-1's task-acked: the store cannot take it yet")
        await within(60, "the step once the server answers", stepping)
        kinds = [e.kind for e in await engine.events.read(key="t-1")]
        [acked] = await engine.events.read(kinds=["effect-acked"])
    finally:
        proxy.refusing = False
        await engine.close()
    assert kinds == ["task-created", "task-assigned", "task-executing", "task-acked",
                     "task-closed"]
    assert acked.data["result"]["task"] == "closed"


class ArmsTheProxy(ChatServer):
    """The scripted model; each chat request it takes arms `proxy` to lose the reply of the
    next commit (the review's settlement), refusing new connections meanwhile."""

    proxy: StallingProxy | None = None

    def _record(self, request: RecordedRequest) -> None:
        super()._record(request)
        proxy = self.proxy
        if proxy is not None and request.method == "POST":

            proxy.lose_next()


async def test_a_review_whose_settlement_lost_its_commit_reply_is_recorded_once(
        tmp_path: Path, postgres_server: PostgresServer, proxy: StallingProxy,
        caplog: pytest.LogCaptureFixture) -> None:
    name = database(postgres_server)
    chat = ArmsTheProxy()
    with chat:
        clock = ManualClock()
        config = AwarenessConfig(initial_delay_s=30, backoff_base_s=600)
        reviewer = build_reviewer(settings(chat, config), LayerContext(tmp_path / "h", clock))
        engine = Engine(tmp_path / "h", clock=clock, layers=[reviewer.layer],
                        store=proxy.url(name, connect_timeout="1"))
        await engine.open()  # its loops not started: the test ticks it
        try:
            board = MemoryBoard(engine.events)
            await board.register("ana", "Ana")
            await board.exchange("ana", "I think I'll stay in Lisbon for good")
            chat.script(reply(narration="I see she is staying"))
            chat.proxy = proxy
            clock.advance(60_000)
            await engine.vitals.record("llm-route", {"ok": True})
            await within(60, "the tick that asks for the review", engine.tick())
            reviewing = asyncio.ensure_future(engine.executor_loop.run_until_idle())

            await answer_once_logged(proxy, caplog,  # sent again; or, unfixed, failed
                                     "the review of ana: the store cannot take it yet",
                                     "retrying while its lease holds")
            await within(60, "the review once the server answers", reviewing)
            cycles = await engine.events.read(kinds=["awareness-cycle"])
            acked = await engine.events.read(kinds=["effect-acked"])
            ledger = (await engine.snapshot()).state(AwarenessLedger)
        finally:
            proxy.refusing = False
            await engine.close()
            await reviewer.client.aclose()
    assert [c.data["outcome"] for c in cycles] == ["reviewed"]
    assert [a.data["result"]["outcome"] for a in acked] == ["reviewed"]
    assert ledger.calls == 1 and ledger.identities["ana"].failures == 0


class PaysOnTheSecondTry(Payer):
    """Fails its first attempt (to be retried 50 ms later) unless told it need not; `armed`
    is called as that attempt fails."""

    max_attempts = 3
    backoff = Backoff(initial_ms=50, factor=1.0, max_ms=50, jitter=0.0)

    def __init__(self, first_fails: bool, armed: Callable[[], None]) -> None:
        super().__init__()
        self.first_fails, self.armed = first_fails, armed
        self.tries = 0

    async def execute(self, effect: Pay, ctx: ExecutionContext) -> None:
        self.tries += 1
        if self.first_fails and ctx.attempt == 1:
            self.armed()
            raise ConnectionError("the payment service is down")
        await super().execute(effect, ctx)


@pytest.mark.parametrize(("first_fails", "stored", "attempts"), [
    (False, True, [1, 1]),  # the lost claim never ran: claimed again under its number
    (False, False, [1]),  # not stored: the claim made again is the first
    (True, True, [1, 2, 2]),
    (True, False, [1, 2]),  # not stored: attempt 1's claim (it ran) is no lost one
])
async def test_a_claim_whose_commit_reply_is_lost_does_not_wait_out_its_lease(
        *, tmp_path: Path, postgres_server: PostgresServer, proxy: StallingProxy,
        first_fails: bool, stored: bool, attempts: list[int]) -> None:
    name = database(postgres_server)
    lost = 2 if first_fails else 1  # the attempt whose claim is lost

    def arm() -> None:  # lose the claim after the failed attempt's outcome, if any
        proxy.lose_next(reply=stored, passing=int(first_fails))

    payer = PaysOnTheSecondTry(first_fails, arm)
    payer.timeout = 600.0  # the lease a lost claim would have to wait out: 10 min
    engine = Engine(tmp_path / "home", store=proxy.url(name, connect_timeout="1"),
                    rules=[pay_on_first_tick], executors=[payer], default_tick_ms=100,
                    executor_scan_interval=0.05)
    await engine.open()  # its loops not started: the test ticks it
    loop = engine.executor_loop
    heard: list[str] = []  # what the loop reports, as it reports it (the log may cap it)
    report = loop.on_error

    def hear(where: str, exc: BaseException) -> None:
        heard.append(where)
        report(where, exc)

    loop.on_error = hear
    running: asyncio.Future[None] | None = None
    try:
        await within(60, "tick 1", engine.tick())
        if not first_fails:
            arm()
        running = asyncio.ensure_future(loop.run())

        assert not payer.paid

        async def claim_failed() -> bool:
            return any(f"attempt {lost} of effect" in where for where in heard)

        # the loop's scans fail too while the server is refused, and their reports may fill
        # the log's share for background failures before the claim's: wait for the claim's
        await until(claim_failed, 60, "the loop to report the claim it could not write")
        assert proxy.cuts == 1
        proxy.refusing = False

        async def acked() -> bool:
            return bool(await engine.events.read(kinds=["effect-acked"]))

        await until(acked, 60, "the effect to be claimed again and run")
        claims = await engine.events.read(kinds=["effect-executing"])
    finally:
        proxy.refusing = False
        if running is not None:
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
        await engine.close()
    assert len(payer.paid) == 1 and payer.tries == 1 + first_fails
    assert [c.data["attempt"] for c in claims] == attempts


async def test_a_hermes_notice_whose_claim_lost_its_commit_reply_is_still_offered(
        postgres_server: PostgresServer, proxy: StallingProxy) -> None:
    name = database(postgres_server)
    store = await open_event_store(proxy.url(name, connect_timeout="1"))
    follower = NoticeFollower(["notify"], max_age_ms=600_000)
    try:
        (effect,) = (await store.append([effect_draft(
            Notify(topic="disk", level="critical", text="disk / is full"),
            origin="survival")])).events

        proxy.lose_next()  # the next commit is the notice's claim
        now = effect.ts + 1_000
        assert await within(60, "the claim whose reply is lost",
                            follower.claim(store, now, "s-1")) == []
        assert proxy.cuts == 1
        proxy.refusing = False
        lines = await within(60, "the next turn's claim", follower.claim(store, now, "s-2"))
        offers = await store.read(kinds=["hermes-notice-offered"])
    finally:
        proxy.refusing = False
        await store.close()
    assert len(lines) == 1 and "disk / is full" in lines[0]
    assert len(offers) == 1
