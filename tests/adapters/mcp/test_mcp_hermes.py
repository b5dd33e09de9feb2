"""pulse's MCP server under the real Hermes (hermes-agent from PyPI): Hermes starts `upulse
mcp` from its `mcp_servers` config, `hermes mcp test` lists pulse's tools, and Hermes offers
them to its model; when the model (a loopback stand-in) calls them, the fact lands in pulse's
log, each tool's answer (a refusal too) is in the model's next request, and `upulse mcp`
ends with Hermes.

The turn runs as `hermes chat -Q -q`, which waits for MCP discovery (up to
`mcp_discovery_timeout`) before the agent takes its tools; `hermes -z` does not wait, and offers
the model no pulse tools whenever `upulse mcp` answers after the turn has begun."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from pulse_adapters.llm.stand_in import ChatServer, Stream, ToolCall
from tests.adapters.hermes.rig import HermesRig, chat_requests, hermes_rig
from tests.adapters.mcp.rig import UPULSE, facts, mcp_home, server_args, servers_of
from tests.timing import eventually

TEST_TIME_LIMIT_S = 300  # bounds a hang only: one hermes run, bounded by HermesRig.run
DISCOVERY_LIMIT_S = 60  # bounds a hang only: Hermes's own connect_timeout for a server


def hermes_serving_pulse(tmp_path: Path, chat_server: ChatServer) -> tuple[HermesRig, Path]:
    """A private Hermes whose config.yaml names pulse under `mcp_servers`, and pulse's home."""
    home = mcp_home(tmp_path / "pulse")
    rig = hermes_rig(tmp_path, chat_server)
    config = rig.hermes_home / "config.yaml"
    config.write_text(config.read_text(encoding="utf-8") + "\n".join([
        f"mcp_discovery_timeout: {DISCOVERY_LIMIT_S}",
        "mcp_servers:", "  pulse:", f"    command: {UPULSE}",
        f"    args: {json.dumps(server_args(home))}", ""]), encoding="utf-8")
    return rig, home


async def test_hermes_mcp_test_connects_to_pulse_and_lists_its_tools(
        tmp_path: Path, chat_server: ChatServer) -> None:
    rig, _ = hermes_serving_pulse(tmp_path, chat_server)
    done, _ = await asyncio.to_thread(rig.run, "mcp", "test", "pulse")
    assert done.returncode == 0, done.stderr
    assert "Connected" in done.stdout, done.stdout
    listed = {line.split()[0] for line in done.stdout.splitlines()
              if line.startswith("    ") and line.strip()}
    assert {"remember", "recall", "create_task", "task_state",
            "maintenance_report"} <= listed, done.stdout


async def test_what_hermes_remembers_through_pulse_is_in_the_log_and_recalled_to_its_model(
        tmp_path: Path, chat_server: ChatServer) -> None:
    rig, home = hermes_serving_pulse(tmp_path, chat_server)
    chat_server.script(
        ToolCall("mcp__pulse__remember", {"identity": "bob", "text": "bob likes tea"}),
        ToolCall("mcp__pulse__remember", {"identity": "ana", "text": "ana moved to Porto"},
                 "call-2"),
        ToolCall("mcp__pulse__recall", {"identity": "ana", "query": "porto"}, "call-3"),
        Stream(("noted",)))

    done, _ = await asyncio.to_thread(rig.run, "chat", "-Q", "-q",
                                      "remember that ana moved to Porto", "-t", "pulse")
    requests = chat_requests(chat_server)
    assert done.returncode == 0, (done.stderr, requests)
    assert done.stdout.strip() == "noted"
    offered = {t["function"]["name"] for t in requests[0]["tools"]}
    assert {"mcp__pulse__remember", "mcp__pulse__recall"} <= offered, offered
    (fact,) = await facts(home)
    assert (fact.origin, fact.key, fact.data["text"]) == (
        "agent:ada", "identity:ana", "ana moved to Porto")
    refused, remembered, recalled = [m for m in requests[3]["messages"] if m["role"] == "tool"]
    assert "identity: 'bob' is not known to pulse" in refused["content"], refused
    assert remembered["tool_call_id"] == "call-2"
    assert (f"remembered as {fact.data['record']} (event #{fact.seq})"
            in remembered["content"]), remembered
    assert recalled["tool_call_id"] == "call-3"
    assert "ana moved to Porto" in recalled["content"], recalled
    await eventually(lambda: not servers_of(home), within=30,
                     what="Hermes ending the upulse mcp it started")
