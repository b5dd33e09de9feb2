"""`upulse mcp --http` as a real subprocess, driven by the SDK's own streamable HTTP client:
the tools as over stdio, 127.0.0.1 only, the web UI's token required (a request without it
is 401 and recorded), and a client killed mid-call leaves every call stored whole or not at
all, on either transport."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import psutil
import pytest

from pulse_core import open_home
from pulse_core.memory import Recaller, RecallQuery
from tests.adapters.mcp.rig import events, http_server, http_session, make_home, text, token
from tests.cli.runner import Upulse
from tests.timing import eventually, scaled

CLIENT = Path(__file__).with_name("mid_call_client.py")


async def test_tools_answer_over_http_with_the_token(upulse: Upulse, tmp_path: Path) -> None:
    home = make_home(upulse, tmp_path)
    with http_server(upulse, home) as url:
        assert url.startswith("http://127.0.0.1:") and url.endswith("/mcp")
        async with http_session(url, token(home)) as session:
            names = {t.name for t in (await session.list_tools()).tools}
            assert {"remember", "recall", "arm_watch", "answer_decision", "list_notices",
                    "ack_notice", "record_commitment", "close_commitment"} <= names
            done = await session.call_tool("remember", {"identity": "ana",
                                                        "text": "ana sings in a choir"})
            assert not done.isError, text(done)
            found = await session.call_tool("recall", {"identity": "ana", "query": "choir"})
            assert "ana sings in a choir" in text(found)
            refused = await session.call_tool("remember", {"identity": "bob", "text": "x"})
            assert refused.isError and "identity" in text(refused)
    facts = await events(home, "temporal-fact-recorded")
    assert [e.origin for e in facts] == ["agent:ada"]


async def test_a_request_without_the_token_is_401_and_recorded(upulse: Upulse,
                                                               tmp_path: Path) -> None:
    home = make_home(upulse, tmp_path)
    hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "stranger", "version": "1"}}}
    accept = {"Accept": "application/json, text/event-stream"}
    with http_server(upulse, home) as url:
        async with httpx.AsyncClient(timeout=scaled(10)) as client:
            bare = await client.post(url, json=hello, headers=accept)
            wrong = await client.post(url, json=hello, headers={
                **accept, "Authorization": "Bearer not-the-token"})
            right = await client.post(url, json=hello, headers={
                **accept, "Authorization": f"Bearer {token(home)}"})
        assert (bare.status_code, wrong.status_code) == (401, 401)
        assert "upulse ui" in bare.text and token(home) not in bare.text
        assert right.status_code == 200, right.text
        async with httpx.AsyncClient(timeout=scaled(10)) as client:
            rebound = await client.post(url, json=hello, headers={
                **accept, "Authorization": f"Bearer {token(home)}", "Host": "evil.example"})
        assert rebound.status_code in (400, 403, 421), rebound.text  # the SDK's Host check
        try:
            async with http_session(url, "not-the-token"):
                pytest.fail("the SDK's client was let in with a wrong token")
        except BaseExceptionGroup as group:
            assert group.subgroup(lambda e: isinstance(e, httpx.HTTPStatusError)
                                  and e.response.status_code == 401) is not None, group
    refused = await events(home, "mcp-request-refused")
    assert [(e.key, e.origin, e.data["reason"]) for e in refused[:2]] == [
        ("mcp:ada", "agent:ada", "no bearer token"),
        ("mcp:ada", "agent:ada", "a wrong bearer token")]
    assert len(refused) == 3
    assert all(token(home) not in str(e.data) for e in refused)


async def test_a_flood_of_bad_requests_is_recorded_ten_a_minute(upulse: Upulse,
                                                                tmp_path: Path) -> None:
    home = make_home(upulse, tmp_path)
    with http_server(upulse, home) as url:
        async with httpx.AsyncClient(timeout=scaled(10)) as client:
            answers = [(await client.post(url, json={})).status_code for _ in range(25)]
    assert answers == [401] * 25
    refused = await events(home, "mcp-request-refused")
    assert len(refused) == 10  # the rest are counted in the next minute's first record


def serves(process: psutil.Process) -> bool:
    """Whether `process` is an `upulse mcp --http` (a zombie or a gone child of an earlier
    test in this worker has no command line to read: not it)."""
    try:
        return "--http" in process.cmdline()
    except psutil.Error:
        return False


def test_the_http_server_listens_on_127_0_0_1_only(upulse: Upulse, tmp_path: Path) -> None:
    home = make_home(upulse, tmp_path)
    with http_server(upulse, home) as url:
        port = int(re.findall(r":(\d+)/", url)[0])
        server = next(p for p in psutil.Process().children(recursive=True) if serves(p))
        listening = [c.laddr for c in server.net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN]
        assert [(a.ip, a.port) for a in listening] == [("127.0.0.1", port)]


def test_a_taken_port_is_refused_naming_it(upulse: Upulse, tmp_path: Path) -> None:
    home = make_home(upulse, tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = upulse("mcp", "--http", "--port", str(port), "--home", home, ok=False)
    assert done.returncode == 1, done.stderr
    assert f"127.0.0.1:{port}" in done.stderr and "--port" in done.stderr
    assert "Traceback" not in done.stderr


async def _stored_facts(home: Path) -> list[str]:
    stores = await open_home(home, read_only=True)
    try:
        found = await Recaller(stores.events).recall(RecallQuery(identity="ana", text="fact",
                                                                 limit=1_000))
        return [r.text for r in found]
    finally:
        await stores.close()


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_a_client_killed_mid_call_loses_nothing(upulse: Upulse, tmp_path: Path,
                                                      transport: str) -> None:
    home = make_home(upulse, tmp_path, calls_per_minute=10_000)
    out = tmp_path / "client.out"
    with http_server(upulse, home) as url, out.open("w") as sink:
        args = ["stdio", str(home)] if transport == "stdio" else ["http", url, token(home)]
        client = await asyncio.create_subprocess_exec(
            sys.executable, str(CLIENT), *args, env=upulse.env, stdin=subprocess.DEVNULL,
            stdout=sink)
        try:
            await eventually(lambda: out.read_text().count("done ") >= 10, 60,
                             "ten answered calls")
            servers = psutil.Process(client.pid).children(recursive=True)
        finally:
            with contextlib.suppress(ProcessLookupError):
                client.kill()  # SIGKILL, with calls in flight: it never stops calling
            await client.wait()
        for server in servers:  # stdio: the server sees its stdin close and ends
            server.wait(timeout=scaled(30))
    # http: leaving http_server stopped the server, after the calls in flight
    answered = {int(line.split()[1]) for line in out.read_text().splitlines()
                if line.startswith("done ")}
    facts = await _stored_facts(home)
    numbers = [int(f.rsplit(" ", 1)[1]) for f in facts]
    assert all(re.fullmatch(r"fact \d+", f) for f in facts), facts
    assert len(numbers) == len(set(numbers)), "a call was stored twice"
    assert answered <= set(numbers), "an answered call is missing from the log"
    assert len(facts) == len(await events(home, "temporal-fact-recorded"))
