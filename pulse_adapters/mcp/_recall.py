"""The recall tool's one lookup: pulse_core.memory's recall, its fold kept between calls."""

from __future__ import annotations

from collections.abc import Iterable

from mcp.server.fastmcp.exceptions import ToolError

from pulse_core import EventStore
from pulse_core.memory import Recaller, RecallQuery, RecallRefused


class Lookup:
    """Recall for one store, used from the server's event loop; what writers under
    `import_origins` wrote ranks at background authority until a person verifies it."""

    def __init__(self, store: EventStore, import_origins: Iterable[str] | None = None) -> None:
        self.recaller = Recaller(store, import_origins=import_origins)

    async def __call__(self, identity: str, query: str, limit: int) -> list[str]:
        """`identity`'s elements whose text holds every word of `query`, best first (ranked
        by authority, confidence, memory strength and recency; archived, forgotten and
        purged elements left out), at most `limit`, each as `[type] text`."""
        try:
            found = await self.recaller.recall(RecallQuery(identity=identity, text=query,
                                                           limit=limit))
        except RecallRefused as exc:
            raise ToolError(f"{exc.field}: {exc}") from None
        return [f"[{r.type}] {r.text}" for r in found]
