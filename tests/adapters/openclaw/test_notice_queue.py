"""OpenClaw notice delivery against what breaks it: two engines on one log, a gateway that
restarts before or after the turn that reads a notice, a full system-event queue, a refused
call, a claim taken over mid-call, more notices than may wait at once. Fast: the gateway's
system-event queue is modelled as OpenClaw 2026.9.6 keeps it (src/infra/system-events.ts: in
memory, 20 per session with the oldest dropped past that, an identical text at the tail not
queued again, drained by the session's next turn), beside a transcript store in OpenClaw's
schema. The real gateway's far end is proved in test_gateway.py."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pulse_adapters.openclaw import (
    NOTICE_DELIVERED,
    NOTICE_FAILED,
    NOTICE_QUEUED,
    AgentStore,
    NoticeDelivery,
    OpenClawCli,
    OpenClawCommandFailed,
    load_settings,
    notice_label,
)
from pulse_core import (
    Engine,
    Event,
    EventDraft,
    EventStore,
    Layer,
    StoreUnavailable,
    effect_draft,
)
from pulse_survival.effects import Notify
from tests.adapters.openclaw.rig import eventually
from tests.adapters.openclaw.test_hostile import add, agent_store, said
from tests.timing import eventually as until
from tests.write_lock import WriteLock

SESSION = "agent:main:main"


class Gateway(OpenClawCli):
    """The gateway's side of notices: `system-event` into the main session's queue, `status`
    (its pid and queued texts), `chat.inject` into the transcript; `turn()` is the agent's
    next turn (drains the queue into the model request, adds a transcript entry);
    `restart()` loses the queue. Every call but `status` is counted in `calls`."""

    MAX = 20

    def __init__(self, store: AgentStore) -> None:
        super().__init__("openclaw", {}, port=1)
        self.store = store
        self.queue: list[str] = []
        self.pid = 4242
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.requests: list[list[str]] = []  # what each turn's model request held
        self.landed = asyncio.Event()
        self.statuses = 0

    async def call(self, method: str, params: Any, *, timeout_s: float | None = None) -> Any:
        if method == "status":
            self.statuses += 1
            return {"pid": self.pid, "queuedSystemEvents": list(self.queue)}
        self.calls.append((method, dict(params)))
        if method == "system-event":
            assert params["sessionKey"] == SESSION
            text = params["text"].strip()
            if not self.queue or self.queue[-1] != text:
                self.queue.append(text)
                if len(self.queue) > self.MAX:
                    self.queue.pop(0)
            self.landed.set()
            return {"ok": True}
        if method == "chat.inject":
            text = f"[{params['label']}]\n\n{params['message']}"
            add(self.store, "main", said(f"i-{len(self.calls)}", text, "assistant"))
            return {"ok": True}
        raise OpenClawCommandFailed(f"unknown method {method}")

    def turn(self) -> list[str]:
        drained, self.queue = self.queue, []
        self.requests.append(drained)
        add(self.store, "main", said(f"t-{len(self.requests)}", "anything new?"))
        return drained

    def restart(self) -> None:
        self.queue = []
        self.pid += 1

    def queued_calls(self) -> list[str]:
        return [p["text"] for m, p in self.calls if m == "system-event"]

    def read_by_model(self, label: str) -> int:
        return sum(f"[{label}]" in text for request in self.requests for text in request)


class Present:
    async def require(self) -> None:
        return None


def delivery(tmp_path: Path, store: AgentStore, gateway: OpenClawCli,
             **notices: Any) -> NoticeDelivery:
    settings = load_settings({"state_dir": str(tmp_path / "state"),
                              "notices": {"session_key": SESSION, "poll_s": 0.02,
                                          "retry_initial_s": 0.05, **notices}})
    return NoticeDelivery(settings, gateway, store, Present())  # type: ignore[arg-type]


async def effect_of(events: EventStore, text: str) -> Event:
    (event,) = (await events.append([effect_draft(
        Notify(topic="disk", level="warning", text=text), "rule:test")])).events
    return event


async def read(events: EventStore, kind: str, key: str | None = None) -> list[Event]:
    return await events.read(kinds=[kind], key=key)


async def recorded(events: EventStore, kind: str, count: int, limit_s: float = 60) -> None:
    """Wait until the log holds exactly `count` events of `kind` (`limit_s` ends a hang)."""
    async def there() -> bool:
        return len(await read(events, kind)) == count

    await eventually(there, limit_s=limit_s)


async def notices_of(events: EventStore, count: int) -> list[Event]:
    """`count` notify effects, appended together."""
    return list((await events.append([effect_draft(
        Notify(topic="disk", level="warning", text=f"notice {n}"), "rule:test")
        for n in range(count)])).events)


async def turn_once_queued(gateway: Gateway, count: int = 1) -> None:
    """The agent's next turn, once `count` notices wait in the queue."""
    await until(lambda: len(gateway.queue) >= count, within=30, what=f"{count} queued")
    gateway.turn()


@dataclass
class OneNotice:
    """An engine, the gateway, one notify effect, and one service settling it (a task)."""

    engine: Engine
    gateway: Gateway
    event: Event
    settling: asyncio.Task[None]

    @property
    def label(self) -> str:
        return notice_label(self.event.key)

    async def settled(self) -> None:
        async with asyncio.timeout(30):  # bounds a hang only
            await self.settling

    async def recorded(self, kind: str) -> list[Event]:
        return await read(self.engine.events, kind)

    async def has(self, kind: str) -> bool:
        return bool(await self.recorded(kind))


@contextlib.asynccontextmanager
async def one_notice(tmp_path: Path, gateway: type[Gateway] = Gateway,
                     queue: Sequence[str] = (), **notices: Any) -> AsyncIterator[OneNotice]:
    """A notice being settled against a `gateway` whose queue already holds `queue`."""
    store = agent_store(tmp_path / "state")
    standin = gateway(store)
    standin.queue = list(queue)
    async with Engine(tmp_path / "pulse") as engine:
        event = await effect_of(engine.events, "disk / is 91% full")
        settling = asyncio.create_task(delivery(tmp_path, store, standin, **notices).settle(
            engine.events, event, event.data["effect"]))
        try:
            yield OneNotice(engine, standin, event, settling)
        finally:
            settling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await settling


async def test_two_engines_on_one_log_queue_a_notice_once_and_the_model_reads_it_once(
    tmp_path: Path,
) -> None:
    store = agent_store(tmp_path / "state")
    gateway = Gateway(store)
    async with Engine(tmp_path / "pulse") as engine:
        event = await effect_of(engine.events, "disk / is 91% full")
        body = event.data["effect"]
        first, second = delivery(tmp_path, store, gateway), delivery(tmp_path, store, gateway)
        async with asyncio.timeout(30):  # bounds a hang only
            await asyncio.gather(first.settle(engine.events, event, body),
                                 second.settle(engine.events, event, body),
                                 turn_once_queued(gateway))
        records = await read(engine.events, NOTICE_DELIVERED)
    assert len(gateway.queued_calls()) == 1, gateway.calls
    assert gateway.read_by_model(notice_label(event.key)) == 1
    assert [r.key for r in records] == [f"openclaw-notice:{event.key}"]
    assert not store.find_text(SESSION, f"[{notice_label(event.key)}]")  # no UI copy


async def test_a_notice_waits_for_a_turn_and_only_then_counts_as_delivered(
    tmp_path: Path,
) -> None:
    async with one_notice(tmp_path) as rig:
        await eventually(lambda: rig.has(NOTICE_QUEUED), limit_s=30)
        for _ in range(5):  # polled while no turn comes: still pending
            await asyncio.sleep(0.05)
            assert not await rig.recorded(NOTICE_DELIVERED)
        assert len(rig.gateway.calls) == 1
        rig.gateway.turn()
        await rig.settled()
        (record,) = await rig.recorded(NOTICE_DELIVERED)
    assert record.data["recovered"] is False


async def test_a_gateway_restarted_before_the_turn_gets_the_notice_again(
    tmp_path: Path,
) -> None:
    async with one_notice(tmp_path) as rig:
        await until(lambda: bool(rig.gateway.queue), within=30, what="a queued notice")
        rig.gateway.restart()  # its queue is lost with it
        await turn_once_queued(rig.gateway)
        await rig.settled()
        queued = await rig.recorded(NOTICE_QUEUED)
    assert len(rig.gateway.queued_calls()) == 2
    assert [e.data["gateway_pid"] for e in queued] == [4242, 4243]
    assert rig.gateway.read_by_model(rig.label) == 1


async def test_a_gateway_restarted_after_the_turn_that_read_it_is_not_sent_it_again(
    tmp_path: Path,
) -> None:
    async with one_notice(tmp_path) as rig:
        await until(lambda: bool(rig.gateway.queue), within=30, what="a queued notice")
        rig.gateway.turn()
        rig.gateway.restart()  # before the service looked again: the transcript tells
        await rig.settled()
        (record,) = await rig.recorded(NOTICE_DELIVERED)
    assert len(rig.gateway.queued_calls()) == 1
    assert record.data["recovered"] is True
    assert rig.gateway.read_by_model(rig.label) == 1


async def test_a_full_queue_is_not_pushed_over_and_the_notice_queued_after_a_turn(
    tmp_path: Path,
) -> None:
    others = [f"cron job {n} finished" for n in range(Gateway.MAX)]
    async with one_notice(tmp_path, queue=others) as rig:
        await asyncio.sleep(0.2)  # ten polls: none may queue into the full queue
        assert rig.gateway.queue == others and rig.gateway.calls == []
        rig.gateway.turn()  # the agent reads the cron events
        await turn_once_queued(rig.gateway)
        await rig.settled()
    assert rig.gateway.requests[0] == others
    assert rig.gateway.read_by_model(rig.label) == 1


async def test_no_more_notices_wait_in_the_gateway_than_max_queued(tmp_path: Path) -> None:
    store = agent_store(tmp_path / "state")
    gateway = Gateway(store)
    notices = delivery(tmp_path, store, gateway, max_queued=2)
    async with Engine(tmp_path / "pulse", layers=[Layer("openclaw", services=[notices])]) as engine:
        effects = [await effect_of(engine.events, f"notice {n}") for n in range(3)]

        async def queued(count: int) -> bool:
            return len(await read(engine.events, NOTICE_QUEUED)) >= count

        await eventually(lambda: queued(2), limit_s=30)
        assert len(gateway.queue) == 2 and len(gateway.queued_calls()) == 2
        gateway.turn()
        await eventually(lambda: queued(3), limit_s=30)
        gateway.turn()

        async def delivered() -> bool:
            return len(await read(engine.events, NOTICE_DELIVERED)) == 3

        await eventually(delivered, limit_s=30)
        records = await read(engine.events, NOTICE_DELIVERED)
    assert [len(r) for r in gateway.requests] == [2, 1]
    assert all(gateway.read_by_model(notice_label(e.key)) == 1 for e in effects)
    assert max(int(r.data["through"]) for r in records) >= effects[-1].seq


class Refusing(Gateway):
    """Every call refused, the gateway URL with credentials in the error."""

    async def call(self, method: str, params: Any, *, timeout_s: float | None = None) -> Any:
        self.calls.append((method, dict(params)))
        raise OpenClawCommandFailed("`openclaw gateway call` exited with 1: cannot reach "
                                    "wss://operator:s3cret-token@gw.example:18789/rpc?key=k3y")


async def test_a_failed_delivery_is_recorded_without_the_urls_secrets(tmp_path: Path) -> None:
    async with one_notice(tmp_path, Refusing) as rig:
        await eventually(lambda: rig.has(NOTICE_FAILED), limit_s=30)
        failed = await rig.recorded(NOTICE_FAILED)
    error = failed[0].data["error"]
    assert "wss://gw.example:18789" in error
    for secret in ("s3cret-token", "operator", "k3y", "/rpc"):
        assert secret not in error, error


def claim_by(effect_id: str, *, host: str, pid: int, started: float) -> EventDraft:
    """A delivery claim another engine left: its lease runs a minute more."""
    return EventDraft("openclaw-notice-claimed", f"openclaw-notice-attempt:{effect_id}",
                      {"effect_id": effect_id, "owner": f"{host}:{pid}:0", "host": host,
                       "pid": pid, "started": started, "until_ms": int(time.time() * 1000)
                       + 60_000}, origin="executor:openclaw-notices")


async def test_a_live_claim_is_waited_out_and_a_dead_engines_queued_notice_not_sent_twice(
    tmp_path: Path,
) -> None:
    store = agent_store(tmp_path / "state")
    gateway = Gateway(store)
    async with Engine(tmp_path / "pulse") as engine:
        event = await effect_of(engine.events, "a process gave up")
        body, label = event.data["effect"], notice_label(event.key)
        await engine.events.append([claim_by(event.key, host="elsewhere", pid=1, started=1.0)])
        with pytest.raises(TimeoutError):  # another host's engine is delivering it
            async with asyncio.timeout(1.2):
                await delivery(tmp_path, store, gateway).settle(engine.events, event, body)
        assert gateway.calls == []
        # an engine of this host queued it and recorded that, a turn read it, and the
        # engine's process died before it looked again
        await gateway.call("system-event", {"sessionKey": SESSION, "text": f"[{label}] x"})
        await engine.events.append([
            claim_by(event.key, host=socket.gethostname(), pid=2 ** 22 + 7, started=1.0),
            EventDraft(NOTICE_QUEUED, f"openclaw-notice-attempt:{event.key}",
                       {"effect_id": event.key, "session_key": SESSION,
                        "gateway_pid": gateway.pid, "turns": store.turns(SESSION)},
                       origin="executor:openclaw-notices")])
        gateway.turn()
        async with asyncio.timeout(30):
            await delivery(tmp_path, store, gateway).settle(engine.events, event, body)
        (delivered,) = await read(engine.events, NOTICE_DELIVERED)
    assert len(gateway.queued_calls()) == 1
    assert gateway.read_by_model(label) == 1
    assert delivered.data["recovered"] is False


class Held(Gateway):
    """A gateway whose `system-event` call queues at once but answers only when `answer` is
    set: an engine stuck in its call while its claim runs out."""

    def __init__(self, store: AgentStore) -> None:
        super().__init__(store)
        self.answer = asyncio.Event()

    async def call(self, method: str, params: Any, *, timeout_s: float | None = None) -> Any:
        result = await super().call(method, params, timeout_s=timeout_s)
        if method == "system-event":
            await self.answer.wait()
        return result


async def test_a_delivery_taken_over_mid_call_is_queued_once_and_recorded_once(
    tmp_path: Path,
) -> None:
    store = agent_store(tmp_path / "state")
    held = Held(store)
    async with Engine(tmp_path / "pulse") as engine:
        event = await effect_of(engine.events, "disk / is 91% full")
        body = event.data["effect"]
        slow = asyncio.create_task(delivery(tmp_path, store, held).settle(engine.events, event,
                                                                           body))
        async with asyncio.timeout(30):  # bounds a hang only
            await held.landed.wait()
        # its lease ran out; an engine that claimed after it died before delivering
        await engine.events.append([claim_by(event.key, host=socket.gethostname(),
                                             pid=2 ** 22 + 7, started=1.0)])
        takeover = asyncio.create_task(delivery(tmp_path, store, held).settle(
            engine.events, event, body))
        looked = held.statuses
        await until(lambda: held.statuses >= looked + 2, within=30, what="the takeover's polls")
        assert held.queue and len(held.queued_calls()) == 1  # found queued: not sent again
        held.turn()
        async with asyncio.timeout(30):
            await takeover
            held.answer.set()  # the first engine's call returns after the turn read it
            await slow
        records = await read(engine.events, NOTICE_DELIVERED)
        failures = await read(engine.events, NOTICE_FAILED)
    assert len(held.queued_calls()) == 1
    assert held.read_by_model(notice_label(event.key)) == 1
    assert [r.key for r in records] == [f"openclaw-notice:{event.key}"]
    assert failures == []


async def test_an_effect_appended_as_the_engine_starts_gets_its_notice(tmp_path: Path) -> None:
    store = agent_store(tmp_path / "state")
    gateway = Gateway(store)
    notices = delivery(tmp_path, store, gateway)
    async with Engine(tmp_path / "pulse", layers=[Layer("openclaw", services=[notices])]) as engine:
        event = await effect_of(engine.events, "pulse is watching")  # before the service runs
        await turn_once_queued(gateway)

        async def delivered() -> bool:
            return bool(await read(engine.events, NOTICE_DELIVERED))

        await eventually(delivered, limit_s=30)
    assert gateway.read_by_model(notice_label(event.key)) == 1


async def test_a_notice_shown_in_the_ui_is_in_the_transcript_once(tmp_path: Path) -> None:
    store = agent_store(tmp_path / "state")
    gateway = Gateway(store)
    async with Engine(tmp_path / "pulse") as engine:
        event = await effect_of(engine.events, "disk / is 91% full")
        async with asyncio.timeout(30):
            await asyncio.gather(delivery(tmp_path, store, gateway, show_in_ui=True).settle(
                engine.events, event, event.data["effect"]), turn_once_queued(gateway))
    assert [m for m, _ in gateway.calls] == ["system-event", "chat.inject"]
    assert store.find_text(SESSION, "disk / is 91% full")
    assert gateway.read_by_model(notice_label(event.key)) == 1


async def test_a_waiting_notice_asks_the_gateway_when_a_turn_is_seen_not_on_a_timer(
    tmp_path: Path,
) -> None:
    async with one_notice(tmp_path, poll_s=3600) as rig:
        await eventually(lambda: rig.has(NOTICE_QUEUED), limit_s=30)
        asked = rig.gateway.statuses
        await asyncio.sleep(1.6)  # three reads of the transcript, no turn in it
        assert rig.gateway.statuses == asked  # each `openclaw gateway call` costs seconds of CPU
        rig.gateway.turn()
        await rig.settled()
    assert rig.gateway.statuses == asked + 1
    assert rig.gateway.read_by_model(rig.label) == 1


async def test_notices_waiting_for_a_turn_share_one_status_call_a_poll(tmp_path: Path) -> None:
    store = agent_store(tmp_path / "state")
    gateway = Gateway(store)
    poll_s, waited_s, waiting = 0.2, 2.0, 5
    notices = delivery(tmp_path, store, gateway, poll_s=poll_s)
    async with Engine(tmp_path / "pulse", layers=[Layer("openclaw", services=[notices])]) as engine:
        effects = [await effect_of(engine.events, f"notice {n}") for n in range(waiting)]
        await recorded(engine.events, NOTICE_QUEUED, waiting, limit_s=30)
        before = gateway.statuses
        await asyncio.sleep(waited_s)  # no turn: each notice would ask every poll_s
        polled = gateway.statuses - before
        gateway.turn()
        await recorded(engine.events, NOTICE_DELIVERED, waiting, limit_s=30)
    # a call each poll_s at most (one each was 5 a poll: seconds of a Node process's CPU)
    assert 1 <= polled <= waited_s / poll_s + 2, polled
    assert all(gateway.read_by_model(notice_label(e.key)) == 1 for e in effects)


STATUS_S = 0.5


class Slow(Gateway):
    """A gateway whose `status` takes `STATUS_S`, as the real CLI's takes seconds."""

    async def call(self, method: str, params: Any, *, timeout_s: float | None = None) -> Any:
        if method == "status":
            await asyncio.sleep(STATUS_S)
        return await super().call(method, params, timeout_s=timeout_s)


async def test_notices_queued_together_share_the_gateway_status_calls(tmp_path: Path) -> None:
    store = agent_store(tmp_path / "state")
    gateway = Slow(store)
    count = 5
    notices = delivery(tmp_path, store, gateway, poll_s=3600)
    async with Engine(tmp_path / "pulse", layers=[Layer("openclaw", services=[notices])]) as engine:
        effects = await notices_of(engine.events, count)
        await recorded(engine.events, NOTICE_QUEUED, count)
        asked = gateway.statuses
        gateway.turn()
        await recorded(engine.events, NOTICE_DELIVERED, count)
    # one before and one after queueing each were 10: what begins after a notice's claim
    # (after its system event) answers every notice that needed it (4 here; one more if
    # the claims were spread over more than STATUS_S)
    assert asked <= count + 1, asked
    assert len(gateway.queued_calls()) == count
    assert all(gateway.read_by_model(notice_label(e.key)) == 1 for e in effects)


class Unreachable(Gateway):
    """A gateway whose `status` calls fail after `STATUS_S` (counted), as a CLI that cannot
    reach it."""

    async def call(self, method: str, params: Any, *, timeout_s: float | None = None) -> Any:
        if method == "status":
            await asyncio.sleep(STATUS_S)
            self.statuses += 1
            raise OpenClawCommandFailed("`openclaw gateway call` exited with 1: gateway closed")
        return await super().call(method, params, timeout_s=timeout_s)


async def test_notices_raised_together_share_a_failed_status_call(tmp_path: Path) -> None:
    store = agent_store(tmp_path / "state")
    gateway = Unreachable(store)
    count = 5
    notices = delivery(tmp_path, store, gateway, retry_initial_s=60, retry_max_s=60)
    async with Engine(tmp_path / "pulse", layers=[Layer("openclaw", services=[notices])]) as engine:
        await notices_of(engine.events, count)
        await recorded(engine.events, NOTICE_FAILED, count)
        errors = [e.data["error"] for e in await read(engine.events, NOTICE_FAILED)]
    # each waiting behind a call that failed takes its failure (5 failed calls before)
    assert gateway.statuses <= 2, gateway.statuses
    assert all("gateway closed" in error for error in errors), errors


class StatusHeld(Gateway):
    """A gateway whose `status` answers only once `answer` is set (`asking`: one waits)."""

    def __init__(self, store: AgentStore) -> None:
        super().__init__(store)
        self.asking = asyncio.Event()
        self.answer = asyncio.Event()

    async def call(self, method: str, params: Any, *, timeout_s: float | None = None) -> Any:
        if method == "status" and not self.answer.is_set():
            self.asking.set()
            await self.answer.wait()
        return await super().call(method, params, timeout_s=timeout_s)


async def test_a_delivery_taken_over_while_the_gateway_was_asked_is_not_queued(
    tmp_path: Path,
) -> None:
    store = agent_store(tmp_path / "state")
    gateway = StatusHeld(store)
    async with Engine(tmp_path / "pulse") as engine:
        event = await effect_of(engine.events, "disk / is 91% full")
        notices = delivery(tmp_path, store, gateway)
        claim = notices.claims.claim
        claims = 0

        async def counted(events: EventStore, effect_id: str, cause: int) -> bool:
            nonlocal claims
            claims += 1
            return await claim(events, effect_id, cause)

        notices.claims.claim = counted  # type: ignore[method-assign]
        settling = asyncio.create_task(notices.settle(engine.events, event,
                                                      event.data["effect"]))
        try:
            async with asyncio.timeout(30):  # bounds a hang only
                await gateway.asking.wait()
            # its status call waited its turn past its lease, and another host's engine
            # took the delivery over meanwhile
            await engine.events.append([claim_by(event.key, host="elsewhere", pid=1,
                                                 started=1.0)])
            gateway.answer.set()
            await until(lambda: claims >= 2 or gateway.queued_calls(), within=30,
                        what="the claim tried again, or the notice queued")
        finally:
            settling.cancel()
            await asyncio.wait({settling})
    assert gateway.queued_calls() == []  # the other engine's to queue
    assert claims >= 2


class TurnAsQueued(Gateway):
    """A gateway whose agent takes a turn as the first notice is queued: the turn drains the
    queue as it builds its prompt and writes its transcript row `ROW_S` later."""

    ROW_S = 1.0

    async def call(self, method: str, params: Any, *, timeout_s: float | None = None) -> Any:
        result = await super().call(method, params, timeout_s=timeout_s)
        if method == "system-event" and not self.requests:
            drained, self.queue = self.queue, []
            self.requests.append(drained)
            asyncio.get_running_loop().call_later(self.ROW_S, add, self.store, "main",
                                                  said("t-late", "anything new?"))
        return result


async def test_a_turn_that_took_the_notice_before_its_row_was_written_is_not_sent_it_again(
    tmp_path: Path,
) -> None:
    async with one_notice(tmp_path, gateway=TurnAsQueued) as rig:
        await until(lambda: rig.settling.done() or len(rig.gateway.queued_calls()) > 1,
                    within=30, what="the notice settled, or queued again")
        failed = await rig.recorded(NOTICE_FAILED)
    assert len(rig.gateway.queued_calls()) == 1, failed  # before: NoticeNotListed, again
    assert rig.gateway.read_by_model(rig.label) == 1
    assert failed == []


class Unlisted(Gateway):
    """A gateway that takes system events for a session its status does not report (not an
    agent's main session)."""

    async def call(self, method: str, params: Any, *, timeout_s: float | None = None) -> Any:
        result = await super().call(method, params, timeout_s=timeout_s)
        if method == "system-event":
            self.queue.clear()
        return result


async def test_a_session_whose_queue_the_gateway_does_not_report_fails_saying_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("pulse_adapters.openclaw._notices.TURN_ROW_S", 0.2)
    async with one_notice(tmp_path, gateway=Unlisted) as rig:
        await eventually(lambda: rig.has(NOTICE_FAILED), limit_s=30)
        (failed, *_) = await rig.recorded(NOTICE_FAILED)
    assert "NoticeNotListed" in failed.data["error"]
    assert "notices need an agent's main session as notices.session_key" in \
        failed.data["error"]


class RefusingOne(Gateway):
    """A gateway that refuses to queue any text holding `refused`."""

    refused = "notice 0"

    async def call(self, method: str, params: Any, *, timeout_s: float | None = None) -> Any:
        if method == "system-event" and self.refused in params["text"]:
            raise OpenClawCommandFailed("the gateway refused it")
        return await super().call(method, params, timeout_s=timeout_s)


async def test_a_notice_still_pending_is_not_skipped_by_a_restart_after_a_later_one_settled(
    tmp_path: Path,
) -> None:
    store = agent_store(tmp_path / "state")
    gateway = RefusingOne(store)
    first = delivery(tmp_path, store, gateway)
    async with Engine(tmp_path / "pulse", layers=[Layer("openclaw", services=[first])]) as engine:
        stuck = await effect_of(engine.events, "notice 0")
        later = await effect_of(engine.events, "notice 1")
        await turn_once_queued(gateway)

        async def delivered() -> bool:
            return bool(await read(engine.events, NOTICE_DELIVERED))

        await eventually(delivered, limit_s=30)
        (record,) = await read(engine.events, NOTICE_DELIVERED)
        assert record.key == f"openclaw-notice:{later.key}"
        assert int(record.data["through"]) < stuck.seq
    gateway.refused = "never"
    again = delivery(tmp_path, store, gateway)
    async with Engine(tmp_path / "pulse", layers=[Layer("openclaw", services=[again])]) as engine:
        await turn_once_queued(gateway)

        async def both() -> bool:
            return len(await read(engine.events, NOTICE_DELIVERED)) == 2

        await eventually(both, limit_s=30)
    assert gateway.read_by_model(notice_label(stuck.key)) == 1
    assert gateway.read_by_model(notice_label(later.key)) == 1


class LocksTheLogAsItQueues(Gateway):
    """Queues the notice, then another process takes the pulse log's write lock for a
    moment: the record that it was queued cannot be stored."""

    db = Path()

    def __init__(self, store: AgentStore) -> None:
        super().__init__(store)
        self.locks: list[WriteLock] = []

    async def call(self, method: str, params: Any, *, timeout_s: float | None = None) -> Any:
        answer = await super().call(method, params, timeout_s=timeout_s)
        if method == "system-event" and not self.locks:  # held until the test lets it go
            self.locks.append(await asyncio.to_thread(WriteLock, self.db))
        return answer


async def test_a_notice_whose_queued_record_the_store_refused_is_not_queued_again(
    tmp_path: Path,
) -> None:
    db = tmp_path / "events.db"
    LocksTheLogAsItQueues.db = db
    store = agent_store(tmp_path / "state")
    gateway = LocksTheLogAsItQueues(store)
    service = delivery(tmp_path, store, gateway)
    async with Engine(tmp_path / "pulse", store=f"sqlite:///{db}?busy_timeout=0.2") as engine:
        event = await effect_of(engine.events, "disk / is 91% full")
        body = event.data["effect"]
        with pytest.raises(StoreUnavailable):  # its record, then its failure: not stored
            async with asyncio.timeout(30):  # bounds a hang only
                await service.settle(engine.events, event, body)
        gateway.turn()  # the model reads it
        await asyncio.to_thread(gateway.locks[0].release)
        again = asyncio.ensure_future(service.settle(engine.events, event, body))
        async with asyncio.timeout(30):  # the service's restart settles it again
            while not again.done():
                if gateway.queue:  # queued again: the next turn reads it again
                    gateway.turn()
                await asyncio.sleep(0.02)
            await again
        delivered = await read(engine.events, NOTICE_DELIVERED)
    assert len(gateway.queued_calls()) == 1, gateway.calls
    assert gateway.read_by_model(notice_label(event.key)) == 1
    assert len(delivered) == 1
