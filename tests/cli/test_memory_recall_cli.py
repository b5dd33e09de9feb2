"""`upulse memory recall`: what the agent recalls, from the shell, as a real process on a real
home whose element text is sealed."""

from __future__ import annotations

from pathlib import Path

from pulse_core import open_home
from pulse_core.maintenance import (
    AGENT,
    BACKGROUND,
    Authority,
    ElementsReader,
    RetentionLadder,
)
from pulse_core.memory import MemoryBoard
from tests.cli.runner import Upulse, agent_then_feed, name_import_origins


async def test_recall_finds_sealed_text_leaves_archived_out_and_refuses_bad_queries(
    upulse: Upulse, tmp_path: Path,
) -> None:
    home = upulse.init(tmp_path / "home")
    said = upulse.json("memory", "exchange", "ana", "I moved to Lisbon", "--home", home)
    assert isinstance(said, dict)
    stores = await open_home(home)
    try:
        await MemoryBoard(stores.events).set_state("ana", "city", "Lisbon, Alfama")
        ladder = RetentionLadder(
            stores.events, ElementsReader(stores.events),
            Authority(stores.events, standing={"maintenance": ("archive",)}), "maintenance",
            origin="executor:maintenance")
        await ladder.archive("ana/city")
    finally:
        await stores.close()
    found = upulse.json("memory", "recall", "lisbon", "--home", home)
    assert isinstance(found, list)
    assert [(r["record"], r["text"]) for r in found] == [
        (said["data"]["record"], "I moved to Lisbon")]
    archived = upulse.json("memory", "recall", "lisbon", "--archived", "--home", home)
    assert isinstance(archived, list)
    assert sorted(r["stage"] for r in archived) == ["active", "archived"]
    table = upulse("memory", "recall", "--identity", "ana", "--home", home).stdout
    assert "I moved to Lisbon" in table and "Alfama" not in table
    typo = upulse("memory", "recall", "--identity", "anna", "--home", home, ok=False)
    assert typo.returncode == 1 and "did you mean 'ana'?" in typo.stderr
    zero = upulse("memory", "recall", "lisbon", "--limit", "0", "--home", home, ok=False)
    assert zero.returncode == 2 and "limit" in zero.stderr
    nothing = upulse("memory", "recall", "--home", home, ok=False)
    assert nothing.returncode == 2 and "identity, a topic or a text" in nothing.stderr


async def test_recall_ranks_what_the_homes_import_origins_wrote_below_the_agents_word(
    upulse: Upulse, tmp_path: Path,
) -> None:
    home = upulse.init(tmp_path / "home")
    await agent_then_feed(home, "Lisbon", "Lisbon")

    def ranked() -> list[tuple[str, int]]:
        found = upulse.json("memory", "recall", "lisbon", "--home", home)
        assert isinstance(found, list)
        return [(r["record"], r["authority"]) for r in found]

    assert ranked() == [("home", AGENT), ("city", AGENT)]  # not an import origin by default
    name_import_origins(home, "agent:rss")
    assert ranked() == [("city", AGENT), ("home", BACKGROUND)]
