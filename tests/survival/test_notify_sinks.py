"""The notify executor's sinks outside the log (a log file, a webhook) never receive a sealed
memory text, nor its words: the `notification` event keeps the sealed token (a purge still
erases it everywhere); the file gets a placeholder marked `sealed`."""

from __future__ import annotations

import json
from pathlib import Path

from pulse_core import ExecutionContext, Quote, SqliteEventStore, SystemClock
from pulse_survival import NotifySinks
from pulse_survival.effects import Notify
from pulse_survival.executors import SEALED_ELSEWHERE, NotifyExecutor

TOKEN = "\x1epulse-sealed:v1:c2VhbGVkIHdvcmRz:ana/c-call"


async def test_a_sealed_quote_reaches_the_log_file_as_a_placeholder_not_a_token(
    tmp_path: Path,
) -> None:
    store = await SqliteEventStore.open(tmp_path / "events.db")
    log = tmp_path / "notices" / "notices.log"
    ctx = ExecutionContext(effect_id="e-1", attempt=1, seq=1, origin="survival",
                           clock=SystemClock(), events=store)
    notice = Notify(topic="commitment", level="warning", text="commitment ana/c-call is overdue",
                    quoted=(Quote(source="commitment", text=TOKEN),
                            Quote(source="error-log", text="ERROR disk full")))
    try:
        await NotifyExecutor(NotifySinks(log_file=str(log))).execute(notice, ctx)
        (event,) = await store.read(kinds=["notification"])
    finally:
        await store.close()
    (line,) = log.read_text().splitlines()
    written = json.loads(line)
    assert written["quoted"] == [
        {"source": "commitment", "text": SEALED_ELSEWHERE, "sealed": True},
        {"source": "error-log", "text": "ERROR disk full"}]
    assert "pulse-sealed" not in line
    assert event.data["quoted"][0]["text"] == TOKEN
