"""Live event streams by the dozen over real HTTP against the UI's real process: every stream
gets every event, each event is encoded once however many streams send it (the UI's own
count in /metrics), and a client that stops reading is let go of, then resumes where it was."""

from __future__ import annotations

import asyncio
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from pulse_core import EventDraft
from tests.web.conftest import UiProcess, run_async, wait_for

STREAMS = 32
BIG = 200_000
"""Characters in each large event's title."""
WITHIN_S = 45.0
"""How long a test waits for what it reads (only bounds a hang)."""


@pytest.fixture
def ui(tmp_path: Path) -> Iterator[UiProcess]:
    served = UiProcess(tmp_path / "home", {"port": 0})
    served.start()
    try:
        yield served
    finally:
        served.stop()


def large(n: int, size: int = BIG) -> EventDraft:
    return EventDraft("task-created", f"big-{n}", {
        "title": f"{n}:" + "x" * size, "project": "web", "prompt": "", "priority": 0})


def metric(ui: UiProcess, name: str) -> float:
    """A sample's value in the UI's /metrics."""
    text = httpx.get(ui.url + "metrics", headers=ui.bearer(), timeout=WITHIN_S).text
    found = re.search(rf"^{name} (\S+)$", text, re.MULTILINE)
    assert found, f"{name} is not in /metrics"
    return float(found[1])


def head(ui: UiProcess) -> int:
    found = httpx.get(ui.url + "api/events?limit=1", headers=ui.bearer(), timeout=WITHIN_S)
    return int(found.json()["head"])


class Opened:
    """Streams that have answered, and an event set once `count` have."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.seen = 0
        self.all = asyncio.Event()

    def one(self) -> None:
        self.seen += 1
        if self.seen == self.count:
            self.all.set()


async def read_stream(ui: UiProcess, client: httpx.AsyncClient, opened: Opened, want: int,
                      params: dict[str, str]) -> list[tuple[int, int]]:
    """(seq, size of its data) of the first `want` events one stream sends."""
    got: list[tuple[int, int]] = []
    async with client.stream("GET", ui.url + "stream/events", params=params) as response:
        assert response.status_code == 200
        seq = 0
        async for line in response.aiter_lines():
            if line.startswith("retry:"):
                opened.one()
            elif line.startswith("id: "):
                seq = int(line[4:])
            elif line.startswith("data: "):
                got.append((seq, len(line)))
                if len(got) == want:
                    return got
    raise AssertionError(f"a stream ended after {len(got)} of {want} events")


def many_streams(ui: UiProcess, want: int, params: dict[str, str],
                 append: list[EventDraft], streams: int = STREAMS
                 ) -> list[list[tuple[int, int]]]:
    """`streams` streams read at once; `append` appended once every one is open."""
    async def run() -> list[list[tuple[int, int]]]:
        opened = Opened(streams)
        limits = httpx.Limits(max_connections=streams + 2)
        async with httpx.AsyncClient(headers=ui.bearer(), limits=limits,
                                     timeout=WITHIN_S) as client:
            readers = [asyncio.create_task(read_stream(ui, client, opened, want, params))
                       for _ in range(streams)]
            await asyncio.wait_for(opened.all.wait(), WITHIN_S)
            if append:
                await asyncio.to_thread(ui.append, *append)
            return await asyncio.wait_for(asyncio.gather(*readers), WITHIN_S)

    return run_async(run)


def test_every_stream_gets_every_large_event_encoded_once(ui: UiProcess) -> None:
    start = head(ui)
    before = metric(ui, "pulse_web_event_messages_encoded_total")
    received = many_streams(ui, 5, {}, [large(n) for n in range(5)])
    expected = list(range(start + 1, start + 6))
    for got in received:
        assert [seq for seq, _ in got] == expected
        assert all(size > BIG for _, size in got)
    assert metric(ui, "pulse_web_event_messages_encoded_total") - before == 5
    assert metric(ui, "pulse_web_event_streams_dropped_total") == 0


def test_streams_catching_up_from_the_log_share_one_encoding(ui: UiProcess) -> None:
    start = head(ui)
    ui.append(*(large(n, 20_000) for n in range(5)))
    before = metric(ui, "pulse_web_event_messages_encoded_total")
    received = many_streams(ui, 5, {"after": str(start)}, [])
    for got in received:
        assert [seq for seq, _ in got] == list(range(start + 1, start + 6))
    assert metric(ui, "pulse_web_event_messages_encoded_total") - before == 5


def test_a_stream_that_stops_reading_is_let_go_of_and_resumes_where_it_was(
        ui: UiProcess) -> None:
    start = head(ui)
    count = 32  # four times what a stream may hold, beyond what the sockets buffer
    fixed = httpx.HTTPTransport(  # a receive buffer that does not grow to the machine's max
        socket_options=[(socket.SOL_SOCKET, socket.SO_RCVBUF, 256 * 1024)])
    with httpx.Client(headers=ui.bearer(), timeout=WITHIN_S, transport=fixed) as client, \
            client.stream("GET", ui.url + "stream/events") as stalled:
        chunks = stalled.iter_bytes()
        assert next(chunks).startswith(b"retry:")
        wait_for(lambda: metric(ui, "pulse_web_event_streams") == 1, 30, "the stream to open")
        ui.append(*(large(n, 1_000_000) for n in range(count)))
        wait_for(lambda: metric(ui, "pulse_web_event_streams_dropped_total") == 1, WITHIN_S,
                 "the stalled stream to be let go of")
        body = b"".join(chunks)  # what it was sent before it was let go of, then its end
    seen = [int(n) for n in re.findall(rb"^id: (\d+)$", body, re.MULTILINE)]
    assert seen == list(range(start + 1, start + 1 + len(seen)))
    assert len(seen) < count
    assert metric(ui, "pulse_web_event_streams") == 0
    resumed = many_streams(ui, count - len(seen), {"after": str(seen[-1] if seen else start)},
                           [], streams=1)
    assert [seq for seq, _ in resumed[0]] == list(range(start + 1 + len(seen),
                                                        start + 1 + count))
