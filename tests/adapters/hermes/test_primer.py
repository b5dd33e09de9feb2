"""The session primer through the real Hermes with the pulse plugin: after a maintenance
cycle refreshed the working state, the session's first turn carries the primer to the model
(with the pending notices after it); with `primer_chars: 0` it does not."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pulse_adapters.hermes import PluginSettings
from pulse_adapters.llm.stand_in import ChatServer, Stream
from pulse_adapters.maintenance import run_cycle
from pulse_core import EventDraft, SystemClock, open_home
from pulse_core.memory import identity_key
from tests.adapters.hermes.rig import chat_requests, hermes_rig

TEST_TIME_LIMIT_S = 300  # bounds a hang only: two hermes runs, each bounded by HermesRig.run

HOUR = 3_600_000


async def refreshed_home(pulse: Path) -> None:
    """A home with an open commitment and a completed maintenance cycle over it."""
    stores = await open_home(pulse)
    try:
        clock = SystemClock()
        await stores.events.append([
            EventDraft("identity-registered", identity_key("owner"), {"name": "Owner"},
                       origin="agent"),
            EventDraft("commitment-made", identity_key("owner"),
                       {"record": "c-report", "text": "send the weekly report",
                        "due_at": clock.now_ms() + 24 * HOUR}, origin="agent")])
        report = await run_cycle(stores.events, clock=clock, cycle="c1")
        assert report.changes["working_state_refreshed"] == 1
    finally:
        await stores.close()


def user_turn(chat_server: ChatServer, index: int) -> str:
    turn = [m for m in chat_requests(chat_server)[index]["messages"] if m["role"] == "user"]
    content = turn[-1]["content"]
    assert isinstance(content, str)
    return content


async def test_a_sessions_first_turn_carries_the_primer_to_the_model(
        tmp_path: Path, chat_server: ChatServer) -> None:
    pulse = tmp_path / "pulse"
    await refreshed_home(pulse)
    rig = hermes_rig(tmp_path, chat_server, plugin=True)
    chat_server.script(Stream(("ok",)), Stream(("ok",)))

    done, _ = await asyncio.to_thread(rig.run, "-z", "what is on my plate?", "-t", "todo",
                                      PULSE_HOME=str(pulse))
    assert done.returncode == 0, done.stderr
    first = user_turn(chat_server, 0)
    assert first.startswith("what is on my plate?")
    assert "Working state as of event #" in first
    assert "- send the weekly report (due " in first

    off, _ = await asyncio.to_thread(rig.run, "-z", "and now?", "-t", "todo",
                                     PULSE_HOME=str(pulse), PULSE_HERMES_NOTICES="0")
    assert off.returncode == 0, off.stderr
    assert "Working state" not in user_turn(chat_server, 1)


def test_primer_chars_is_zero_or_between_80_and_8000() -> None:
    assert PluginSettings(primer_chars=0).primer_chars == 0
    for wrong in (1, 79, 8_001):
        try:
            PluginSettings(primer_chars=wrong)
        except ValueError as exc:
            assert "primer_chars" in str(exc)
        else:
            raise AssertionError(f"primer_chars={wrong} was accepted")
