"""What the awareness tests share: the stand-in's replies, the layer's settings pointing at
it, and an engine running the layer with its service, ticks left in the test's hands."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import msgspec

from pulse_adapters.awareness import AwarenessConfig, Reviewer
from pulse_adapters.llm.stand_in import ChatServer, Stream
from pulse_core import Engine, ManualClock

MINUTE = 60_000


def reply(*, change: bool = False, narration: str = "I see nothing new",
          verbs: list[Any] | None = None, delay_s: float = 0.0) -> Stream:
    text = json.dumps({"meaningful_change": change, "narration": narration,
                       "verbs": verbs or []})
    return Stream(pieces=(text[: len(text) // 2], text[len(text) // 2:]), delay_s=delay_s)


def settings(server: ChatServer, review: AwarenessConfig, **more: Any) -> dict[str, Any]:
    """The layer's object in config.json, pointing at the stand-in server."""
    return {"base_url": server.base_url, "model": "stand-in", "timeout_s": 2.0,
            "max_wall_s": 5.0, "route_ttl_s": 3600, "review": msgspec.to_builtins(review),
            **more}


async def open_engine(home: Path, clock: ManualClock, reviewer: Reviewer
                      ) -> tuple[Engine, asyncio.Future[list[None]]]:
    """An engine running the reviewer's layer, opened, with the layer's services running as
    `engine.start()` would run them (ticks stay in the test's hands)."""
    engine = Engine(home, clock=clock, layers=[reviewer.layer])
    await engine.open()
    running = asyncio.gather(*(service(engine) for service in reviewer.layer.services))
    await asyncio.sleep(0)  # the services bind the quiet hold and the foreground to the engine
    return engine, running


async def close_engine(engine: Engine, service: asyncio.Future[list[None]]) -> None:
    """Stop the layer's service (it writes the rest of the quiet hold), then the engine."""
    service.cancel()
    await asyncio.gather(service, return_exceptions=True)
    await engine.close()
