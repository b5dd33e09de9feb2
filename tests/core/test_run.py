"""Running an engine as a program of its own: `Engine.run_forever()` until SIGTERM or Ctrl-C,
and the demo built on it; real subprocesses and real signals."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from pulse_core import SignalsUnavailable
from pulse_core._run import stop_signals
from tests.e2e.support import read_events

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = """
import asyncio
import sys

from pulse_core import Effect, Engine, ExecutionContext, Executor, Layer, emits


class Slow(Effect, tag="slow"):
    pass


@emits(Slow)
async def once(prev, curr, inner):
    effects, tick_ms = await inner(prev, curr)
    return (effects + [Slow()] if curr.number == 1 else effects), tick_ms


class RunSlowly(Executor):
    handles = (Slow,)
    timeout = 30.0

    async def execute(self, effect: Slow, ctx: ExecutionContext) -> str:
        print("executing", flush=True)
        await asyncio.sleep(1.0)
        return "done"


engine = Engine(sys.argv[1], rules=[once], executors=[RunSlowly()])
print(asyncio.run(engine.run_forever()).name, flush=True)
"""


def child(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, *args], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_run_forever_drains_on_sigterm_and_ctrl_c_records_engine_stopped_and_exits_0(
        tmp_path: Path, signum: signal.Signals) -> None:
    """Item 4: the effect running when the signal arrives finishes (drain), an
    engine-stopped event is the last word, exit 0, nothing on stderr."""
    home = tmp_path / "home"
    engine = child("-c", PROGRAM, str(home))
    try:
        assert engine.stdout is not None
        assert engine.stdout.readline() == "executing\n"
        engine.send_signal(signum)
        out, err = engine.communicate(timeout=30)
    finally:
        if engine.poll() is None:
            engine.kill()
            engine.communicate()
    assert (engine.returncode, out, err) == (0, f"{signum.name}\n", "")
    kinds = [e.kind for e in read_events(home / "events.db",
                                         {"effect-acked", "engine-stopped"})]
    assert kinds == ["effect-acked", "engine-stopped"]


def test_the_demo_on_a_home_another_engine_holds_says_what_to_do_in_one_line(
        tmp_path: Path) -> None:
    """Item 5: no traceback; one line naming the holder and what to do; exit 1."""
    home = tmp_path / "demo"
    first = child("-m", "pulse_core.demo", "--home", str(home))
    try:
        assert first.stdout is not None
        assert first.stdout.readline().startswith(f"pulse demo engine on {home}")
        assert first.stdout.readline().startswith("heartbeat: tick 1")  # it holds the home
        second = child("-m", "pulse_core.demo", "--home", str(home))
        out, err = second.communicate(timeout=30)
        assert second.returncode == 1
        assert err == (f"demo: {home} is held by another engine (pid {first.pid}) — stop it, "
                       "or give this engine another home\n")
        first.send_signal(signal.SIGINT)
        out, err = first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == 0 and err == ""
    assert "stopped after " in out and " heartbeat(s)" in out


async def test_stop_signals_puts_back_a_handler_the_program_set_and_refuses_other_threads(
) -> None:
    """run_forever() promised to restore the handlers set before; it left SIGTERM at its
    default, so a program's own handler was gone after the engine stopped."""


    def own(signum: int, frame: object) -> None:
        pass

    before = signal.signal(signal.SIGTERM, own)
    try:
        async with stop_signals() as received:
            os.kill(os.getpid(), signal.SIGTERM)
            assert await asyncio.wait_for(received, 5) == signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) is own
    finally:
        signal.signal(signal.SIGTERM, before)

    failed: list[BaseException] = []

    def elsewhere() -> None:
        async def enter() -> None:
            async with stop_signals():
                pass
        try:
            asyncio.run(enter())
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join(10)
    assert len(failed) == 1 and isinstance(failed[0], SignalsUnavailable)
