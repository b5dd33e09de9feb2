"""The processes `bench.web_load` runs beside its engine: the UI's load, and a neutral neighbour.

    PULSE_BENCH_TOKEN=... python -m bench.web_client load URL [--streams 50] [--no-api] [--nice 0]
                                                           [--until M]
    python -m bench.web_client neighbour --share 0.4 [--nice 10] [--period-ms 10]

`load` (at niceness --nice) opens --streams live event streams (/stream/events) and keeps
reading them, while one request after another asks the Events API for its first page
(/api/events?limit=100). It prints `ready` once every stream has answered and one API request
has, and on SIGTERM (or once its streams have read --until event messages in all) one line
`requests N messages M api_p50_ms X api_p99_ms Y reconnects R`: what it made and read
meanwhile, and how often the UI ended a stream (it is reopened after its last event id).

`neighbour` is CPU work with nothing of pulse in it: in every --period-ms it computes until
this thread has used `share` of the period's CPU time, then sleeps out the period, at niceness
--nice, until killed. It prints `ready` once reniced.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import signal
import time
from collections.abc import Sequence

import httpx

TOKEN_ENV = "PULSE_BENCH_TOKEN"
"""The UI's token comes through the environment, so it is not on a command line `ps` shows."""


class Load:
    """Streams held open and API requests made back to back, with what they got."""

    def __init__(self, url: str, streams: int, until: int | None = None) -> None:
        self.url = url
        self.streams = streams
        self.until = until
        self.opened = 0
        self.all_open = asyncio.Event()
        self.all_read = asyncio.Event()
        self.messages = 0
        self.reconnects = 0
        self.requests: list[float] = []

    async def stream(self, client: httpx.AsyncClient) -> None:
        """One live stream of every new event, read until cancelled; reconnected after the
        last event it read when the UI ends it, as a browser does."""
        last = ""
        first = True
        while True:
            resume = {"last-event-id": last} if last else {}
            async with client.stream("GET", self.url + "stream/events",
                                     headers=resume) as response:
                response.raise_for_status()
                if first:
                    first = False
                    self.opened += 1
                    if self.opened == self.streams:
                        self.all_open.set()
                async for line in response.aiter_lines():
                    if line.startswith("id: "):
                        last = line[4:]
                    elif line.startswith("event: "):
                        self.messages += 1
                        if self.messages == self.until:
                            self.all_read.set()
            self.reconnects += 1

    async def first_page(self, client: httpx.AsyncClient) -> None:
        """GET /api/events?limit=100 once, timed."""
        started = time.perf_counter()
        response = await client.get(self.url + "api/events", params={"limit": 100})
        response.raise_for_status()
        self.requests.append(time.perf_counter() - started)

    def summary(self) -> str:
        ordered = sorted(self.requests) or [math.nan]

        def at(p: float) -> float:
            return ordered[min(len(ordered) - 1, max(0, math.ceil(p * len(ordered)) - 1))] * 1000

        return (f"requests {len(self.requests)} messages {self.messages} "
                f"api_p50_ms {at(0.50):.2f} api_p99_ms {at(0.99):.2f} "
                f"reconnects {self.reconnects}")


async def load(url: str, token: str, streams: int, api: bool, niceness: int, *,
               until: int | None = None) -> None:
    os.nice(niceness)
    run = Load(url, streams, until)
    stop = run.all_read
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(headers={"authorization": f"Bearer {token}"}, limits=limits,
                                 timeout=None) as client:
        readers = [asyncio.create_task(run.stream(client)) for _ in range(streams)]
        if streams:
            opening = asyncio.create_task(run.all_open.wait())
            done, _ = await asyncio.wait([opening, *readers],
                                         return_when=asyncio.FIRST_COMPLETED)
            if opening not in done:
                opening.cancel()
                for reader in done:
                    reader.result()  # raises what ended it
                raise RuntimeError("a live stream ended before all of them were open")
        if api:
            await run.first_page(client)
        print("ready", flush=True)
        if api:
            while not stop.is_set():
                await run.first_page(client)
        else:
            await stop.wait()
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
    print(run.summary(), flush=True)


def neighbour(share: float, niceness: int, period_s: float) -> None:
    os.nice(niceness)
    print("ready", flush=True)
    budget = share * period_s
    value = 0
    while True:  # until killed
        started, used = time.perf_counter(), time.thread_time()
        while time.thread_time() - used < budget:
            for n in range(200):
                value = (value * 31 + n) % 1_000_003
        rest = started + period_s - time.perf_counter()
        if rest > 0:
            time.sleep(rest)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.web_client", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    modes = parser.add_subparsers(dest="mode", required=True)
    loading = modes.add_parser("load", help="live streams and API requests against a UI")
    loading.add_argument("url", help="the UI's address, e.g. http://127.0.0.1:8421/")
    loading.add_argument("--streams", type=int, default=50, help="live streams (50)")
    loading.add_argument("--no-api", dest="api", action="store_false",
                         help="hold the streams only, no API requests")
    loading.add_argument("--nice", type=int, default=0, help="niceness to run at (0)")
    loading.add_argument("--until", type=int, default=None,
                         help="stop once the streams have read this many event messages")
    burning = modes.add_parser("neighbour", help="CPU work with nothing of pulse in it")
    burning.add_argument("--share", type=float, required=True,
                         help="fraction of one core to use (0..1)")
    burning.add_argument("--nice", type=int, default=0, help="niceness to run at (0)")
    burning.add_argument("--period-ms", type=float, default=10.0,
                         help="the work comes in slices of this period (10 ms)")
    args = parser.parse_args(argv)
    if args.mode == "load":
        token = os.environ.get(TOKEN_ENV)
        if not token:
            parser.error(f"set {TOKEN_ENV} to the UI's token")
        asyncio.run(load(args.url, token, args.streams, args.api, args.nice,
                         until=args.until))
    else:
        if not 0 <= args.share <= 1:
            parser.error(f"--share must be 0..1 (got {args.share})")
        neighbour(args.share, args.nice, args.period_ms / 1000)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
