"""pulse's MCP server under the real Hermes (hermes-agent from PyPI): Hermes starts `upulse
mcp` from its `mcp_servers` config, offers pulse's tools to its model, and when the model
(a loopback stand-in) calls one, the fact lands in pulse's log and the tool's answer is in
the model's next request."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from pulse_adapters.llm.stand_in import ChatServer, Stream, ToolCall
from tests.adapters.hermes.rig import UPULSE, chat_requests, hermes_rig, read_events, upulse

TEST_TIME_LIMIT_S = 300  # bounds a hang only: one hermes run, bounded by HermesRig.run


def pulse_home(tmp_path: Path) -> Path:
    """A pulse home serving MCP as the agent `ada`, whose memory knows `ana`."""
    home = tmp_path / "pulse"
    upulse(home, "init")
    config = json.loads((home / "config.json").read_text())
    config["mcp"] = {"agent": "ada"}
    (home / "config.json").write_text(json.dumps(config))
    upulse(home, "memory", "exchange", "ana", "hello there")
    return home


async def test_what_hermes_remembers_through_pulse_is_in_the_log_and_recalled_to_its_model(
        tmp_path: Path, chat_server: ChatServer) -> None:
    home = pulse_home(tmp_path)
    rig = hermes_rig(tmp_path, chat_server)
    config = rig.hermes_home / "config.yaml"
    config.write_text(config.read_text(encoding="utf-8") + "\n".join([
        "mcp_servers:", "  pulse:", f"    command: {UPULSE}",
        f'    args: ["mcp", "--home", "{home}"]', ""]), encoding="utf-8")
    chat_server.script(
        ToolCall("mcp__pulse__remember", {"identity": "ana", "text": "ana moved to Porto"}),
        ToolCall("mcp__pulse__recall", {"identity": "ana", "query": "porto"}, "call-2"),
        Stream(("noted",)))

    done, _ = await asyncio.to_thread(rig.run, "-z", "remember that ana moved to Porto",
                                      "-t", "pulse")
    requests = chat_requests(chat_server)
    assert done.returncode == 0, (done.stderr, requests)
    assert done.stdout.strip() == "noted"
    offered = {t["function"]["name"] for t in requests[0]["tools"]}
    assert {"mcp__pulse__remember", "mcp__pulse__recall"} <= offered, offered
    facts = await read_events(home, kinds=["temporal-fact-recorded"])
    assert [(e.origin, e.key, e.data["text"]) for e in facts] == [
        ("agent:ada", "identity:ana", "ana moved to Porto")]
    (answer,) = [m for m in requests[1]["messages"] if m["role"] == "tool"]
    assert (f"remembered as {facts[0].data['record']} (event #{facts[0].seq})"
            in answer["content"]), answer
    recalled = [m for m in requests[2]["messages"] if m["role"] == "tool"][-1]
    assert recalled["tool_call_id"] == "call-2"
    assert "ana moved to Porto" in recalled["content"], recalled
