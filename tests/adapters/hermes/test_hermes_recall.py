"""`recall: N` in the pulse plugin's settings: the real Hermes' next model request holds the
top N elements pulse recalls about whom it talks with, and never an archived one."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pulse_adapters.llm.stand_in import ChatServer, Stream
from pulse_core import open_home
from pulse_core.maintenance import Authority, ElementsReader, RetentionLadder
from pulse_core.memory import MemoryBoard
from tests.adapters.hermes.rig import chat_requests, hermes_rig

TEST_TIME_LIMIT_S = 300  # bounds a hang only: one hermes run, bounded by HermesRig.run


async def test_the_turn_is_offered_what_pulse_recalls_and_not_what_maintenance_archived(
        tmp_path: Path, chat_server: ChatServer) -> None:
    rig = hermes_rig(tmp_path, chat_server, plugin=True)
    config = rig.hermes_home / "config.yaml"
    config.write_text(config.read_text(encoding="utf-8")
                      + "  entries:\n    pulse:\n      recall: 2\n", encoding="utf-8")
    pulse = tmp_path / "pulse"
    stores = await open_home(pulse)
    events = stores.events
    board = MemoryBoard(events)
    await board.set_state("owner", "city", "lives in Lisbon", confidence=0.9)
    await board.set_state("owner", "job", "baker at the Alfama bakery")
    await board.set_state("owner", "tea", "drinks green tea", confidence=0.2)
    ladder = RetentionLadder(events, ElementsReader(events),
                             Authority(events, standing={"maintenance": ("archive",)}),
                             "maintenance", origin="executor:maintenance")
    await ladder.archive("owner/job", "not mentioned for months")
    await stores.close()
    chat_server.script(Stream(("hi",)))

    done, _ = await asyncio.to_thread(rig.run, "-z", "say hi", "-t", "todo",
                                      PULSE_HOME=str(pulse))
    assert done.returncode == 0, done.stderr
    turn = [m for m in chat_requests(chat_server)[0]["messages"] if m["role"] == "user"][-1]
    content = turn["content"]
    assert content.startswith("say hi")
    assert "What pulse recalls" in content
    assert "- [state] city: lives in Lisbon" in content
    assert "- [state] tea: drinks green tea" in content  # the top 2 of city and tea
    assert "Alfama" not in content  # archived: out of recall
    assert "say hi\n" not in content.partition("What pulse recalls")[2]  # no exchanges
