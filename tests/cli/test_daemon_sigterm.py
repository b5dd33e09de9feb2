"""SIGTERM while an effect runs in the daemon: the effect is never lost, a restart resumes it."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.cli.runner import Upulse, daemon_pid, wait_until
from tests.e2e.support import read_events

TEST_TIME_LIMIT_S = 90

SLOW = '''"""A slow effect for the SIGTERM test: the first attempt outlives the drain deadline."""

from __future__ import annotations

import asyncio
from pathlib import Path

from pulse_core import Decision, Effect, ExecutionContext, Executor, Inner, Snapshot


class Slow(Effect, tag="slow"):
    """Sleeps long on its first attempt, not on later ones."""

    seconds: float


async def emit_slow(prev: Snapshot, curr: Snapshot, inner: Inner) -> Decision:
    """One Slow effect, on the first tick of a fresh log."""
    effects, tick_ms = await inner(prev, curr)
    if curr.number == 1 and "slow-emitted" not in Path(JOURNAL).read_text():
        Path(JOURNAL).write_text("slow-emitted\\n")
        effects = [*effects, Slow(seconds=30.0)]
    return Decision(effects, tick_ms)


class SlowExecutor(Executor):
    """Writes when it enters and finishes each attempt."""

    handles = (Slow,)
    timeout = 60.0

    async def execute(self, effect: Slow, ctx: ExecutionContext) -> str:
        with open(JOURNAL, "a") as out:
            out.write(f"enter {ctx.effect_id} {ctx.attempt}\\n")
        await asyncio.sleep(effect.seconds if ctx.attempt == 1 else 0.0)
        with open(JOURNAL, "a") as out:
            out.write(f"done {ctx.effect_id} {ctx.attempt}\\n")
        return "slept"


JOURNAL = "{journal}"
'''


def commit(repo: Path, message: str) -> None:
    for args in (["add", "-A"], ["commit", "-q", "-m", message]):
        subprocess.run(["git", "-c", "user.name=test", "-c", "user.email=test@localhost",
                        *args], cwd=repo, check=True, capture_output=True, timeout=30)


def test_sigterm_during_an_effect_leaves_it_claimable_and_a_restart_finishes_it(
        upulse: Upulse, tmp_path: Path) -> None:
    home = upulse.init(tmp_path / "home")
    journal = tmp_path / "journal.txt"
    journal.write_text("")
    engine = home / "engine"
    (engine / "rules" / "slow.py").write_text(SLOW.replace("{journal}", str(journal)))
    text = (engine / "engine.py").read_text()
    text = text.replace("from .rules.inbox import inbox_note\n",
                        "from .rules.inbox import inbox_note\n"
                        "from .rules.slow import SlowExecutor, emit_slow\n")
    text = text.replace("rules=[inbox_note],", "rules=[inbox_note, emit_slow],")
    text = text.replace('executors=[NoteExecutor(context.home / paths.notes)],',
                        'executors=[NoteExecutor(context.home / paths.notes), SlowExecutor()],')
    assert "emit_slow]" in text and "SlowExecutor()]" in text
    (engine / "engine.py").write_text(text)
    commit(engine, "a slow effect (test setup)")

    upulse("daemon", "start", "--home", home)
    wait_until(lambda: "enter" in journal.read_text(), 20, "the slow effect to start")
    upulse("daemon", "stop", "--home", home, "--timeout", "20")
    assert daemon_pid(home) is None
    (failed,) = read_events(home / "events.db", {"effect-failed"})
    assert failed.data["interrupted"] is True and failed.data["final"] is False
    assert not [e for e in read_events(home / "events.db", {"effect-acked"})
                if e.data["result"] == "slept"]  # interrupted, not finished: no ack yet

    upulse("daemon", "start", "--home", home)
    wait_until(lambda: "done" in journal.read_text(), 20, "the restarted daemon to finish it")
    upulse("daemon", "stop", "--home", home, "--timeout", "20")
    lines = journal.read_text().split()
    effect_id = lines[lines.index("enter") + 1]
    assert journal.read_text().splitlines()[1:] == [
        f"enter {effect_id} 1", f"enter {effect_id} 2", f"done {effect_id} 2"]
    slow_acks = [e for e in read_events(home / "events.db", {"effect-acked"})
                 if e.key == effect_id]
    assert len(slow_acks) == 1 and slow_acks[0].data["result"] == "slept"
