"""pulse's MCP server under the real OpenClaw 2026.9.6: `openclaw mcp set` saves it under
`mcp.servers`, `openclaw mcp probe` connects and lists pulse's tools, and a gateway turn
whose model (a loopback stand-in) finds and calls them through OpenClaw's Tool Search stores
the fact in pulse's log and hands each tool's answer to the model's next request."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path
from typing import Any

from pulse_adapters.llm.stand_in import ChatServer, Stream, ToolCall
from tests.adapters.mcp.rig import UPULSE, facts, mcp_home, server_args, servers_of
from tests.adapters.openclaw.rig import start_gateway
from tests.agent_programs import openclaw_program
from tests.timing import eventually

TEST_TIME_LIMIT_S = 600  # bounds a hang only: a gateway starts in ~11 s, past 45 s loaded


def openclaw(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The openclaw CLI on a private HOME and state folder under `root`."""
    program = openclaw_program()
    env = {**os.environ, **program.env, "HOME": str(root / "home"),
           "OPENCLAW_STATE_DIR": str(root / "state"),
           "OPENCLAW_CONFIG_PATH": str(root / "state" / "openclaw.json"), "NO_COLOR": "1"}
    return subprocess.run([str(program.argv0), *args], env=env, capture_output=True, text=True,
                          timeout=240, check=False, stdin=subprocess.DEVNULL, cwd=root)


def pulse_server(home: Path) -> dict[str, Any]:
    """pulse as an `mcp.servers` entry: a stdio server started as `upulse mcp --home HOME`."""
    return {"command": str(UPULSE), "args": server_args(home)}


def test_openclaw_saves_pulse_and_its_probe_lists_pulse_tools(tmp_path: Path) -> None:
    home = mcp_home(tmp_path / "pulse")
    (tmp_path / "home").mkdir()
    saved = openclaw(tmp_path, "mcp", "set", "pulse", json.dumps(pulse_server(home)))
    assert saved.returncode == 0, saved.stderr
    config = json.loads((tmp_path / "state" / "openclaw.json").read_text())
    assert config["mcp"]["servers"]["pulse"] == pulse_server(home)

    probed = openclaw(tmp_path, "mcp", "probe", "pulse", "--json")
    assert probed.returncode == 0, (probed.stdout[-2000:], probed.stderr[-2000:])
    found = json.loads(probed.stdout[probed.stdout.index("{"):])
    assert found["diagnostics"] == []
    assert found["servers"]["pulse"]["launch"] == " ".join([str(UPULSE), *server_args(home)])
    assert {"pulse__remember", "pulse__recall", "pulse__create_task", "pulse__task_state",
            "pulse__maintenance_report"} <= set(found["tools"]), found["tools"]


def tool_answers(body: Any) -> list[str]:
    """The tool results a chat request hands the model, in order."""
    return [str(m["content"]) for m in body["messages"] if m["role"] == "tool"]


async def test_a_gateway_turn_calls_pulse_and_the_model_reads_its_answers(
        tmp_path: Path) -> None:
    home = tmp_path / "pulse"
    with ChatServer() as model:
        # a model on OpenClaw's default Tool Search surface: MCP tools are found, then called
        model.script(
            ToolCall("tool_search", {"query": "remember a fact about a person"}),
            ToolCall("tool_call", {"id": "pulse__remember",
                                   "args": {"identity": "ana", "text": "ana moved to Porto"}},
                     "call-2"),
            ToolCall("tool_call", {"id": "pulse__recall",
                                   "args": {"identity": "ana", "query": "porto"}}, "call-3"),
            Stream(("noted",)))
        gateway = start_gateway(tmp_path, model,
                                {"mcp": {"servers": {"pulse": pulse_server(home)}}})
        try:
            mcp_home(home)  # beside the gateway's pid file; `upulse mcp` starts on a turn
            said = await asyncio.to_thread(gateway.openclaw, "agent", "--message",
                                           "remember that ana moved to Porto", "--json")
            bodies = model.chat_bodies()
            served = servers_of(home)  # the session keeps its MCP runtime between turns
        finally:
            gateway.stop()
    assert [p["text"] for p in said["result"]["payloads"]] == ["noted"], said
    assert len(bodies) == 4, [tool_answers(b) for b in bodies]
    (fact,) = await facts(home)
    assert (fact.origin, fact.key, fact.data["text"]) == (
        "agent:ada", "identity:ana", "ana moved to Porto")
    assert '"name": "pulse__remember"' in tool_answers(bodies[1])[-1]
    assert (f"remembered as {fact.data['record']} (event #{fact.seq})"
            in tool_answers(bodies[2])[-1])
    assert "[fact] ana moved to Porto" in tool_answers(bodies[3])[-1]
    assert len(served) == 1, served
    await eventually(lambda: not servers_of(home), within=60,
                     what="the killed gateway's upulse mcp ending")
