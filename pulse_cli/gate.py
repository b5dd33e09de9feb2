"""The promote gate: what staged engine code must pass before it may run in production.

Four steps, in order, stopping at the first failure:

    compile   every .py byte-compiles
    mypy      `mypy --strict` accepts the engine package
    tests     the engine's own tests pass (pytest in the directory, the engine imported as
              a package: see below)
    dry-run   the engine the daemon would build (pulse_cli.assembly.build_engine: config.json's
              layers and the staged LAYER) can be built, so every effect type a rule
              declares has an executor; one tick of it, on a scratch copy of the live home,
              returns a Decision within the time bound, no staged rule records an error, and
              every effect the tick emitted has an executor
    backtest  that engine's chain over the last recorded ticks (pulse_cli.backtest): how the
              effects it would have decided differ from the recorded ones; fails only when
              they differ by more effects than `max_diff`

The dry run happens in a child process (`python -m pulse_cli.gate dry-run ...`): a rule that
blocks the event loop is killed at the deadline instead of hanging the promote, and the
staged modules never enter the caller's process. Every child Python runs with -P (no script
or working directory on sys.path) and pytest with --import-mode=importlib, so the engine
directory is only ever imported as a package: its types.py is `<package>.types`, and no file
in it can stand in for a standard-library module. The live home is only read: none of its
files (not even a -shm) is written. Gates that share a mypy cache run their mypy steps one at
a time (mypy's cache is not safe for two writers).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import importlib.util
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

import pulse_core
from pulse_cli import config as config_file
from pulse_cli.backtest import BACKTEST_TICKS, Backtest, run_backtest
from pulse_cli.dryrun import copy_live_home
from pulse_cli.home import Home
from pulse_core import HomeLayout, Mark, PulseError, rule_name

GATE_STEPS = ("compile", "mypy", "tests", "dry-run", "backtest")
OUTPUT_LIMIT = 4_000
STEP_TIMEOUT_S = 300.0
OPEN_TIMEOUT_S = 120.0
_MARK = "@pulse-gate "
_DEADLINE_GRACE_S = 2.0
MYPY_LOCK_NAME = ".pulse-gate.lock"


class LockBusy(PulseError):
    """A lock file stayed held by another process for longer than the caller would wait."""


@contextlib.asynccontextmanager
async def exclusive_lock(lock: Path, timeout_s: float, holder: str,
                         waiting: Callable[[str], None] | None = None) -> AsyncIterator[None]:
    """Hold an exclusive lock on the file `lock` (created 0600 when missing), across processes.

    While another process holds it, `waiting` is called once with a line saying so, and the
    wait goes on for up to `timeout_s` seconds; then LockBusy names the lock and `holder`
    (what holds such a lock: "another promote", say).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    fd = await asyncio.to_thread(os.open, lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if loop.time() > deadline:
                    raise LockBusy(f"{lock} was held by {holder} for {timeout_s:g} s — let it "
                                   "finish, then try again") from None
                if waiting is not None and not told:
                    waiting(f"waiting for {holder} to finish ({lock} is held)")
                    told = True
                await asyncio.sleep(0.05)
        yield
    finally:
        os.close(fd)


class GateStep(msgspec.Struct, frozen=True):
    """How one gate step went: its name, whether it passed, how long it took, what it said
    (and, for the backtest step, the backtest)."""

    name: str
    ok: bool
    seconds: float
    output: str = ""
    backtest: Backtest | None = None

    def __str__(self) -> str:
        return f"{'passed' if self.ok else 'FAILED'}  {self.name:<8} {self.seconds:6.1f} s"


def bounded(text: str, limit: int = OUTPUT_LIMIT) -> str:
    """The last `limit` characters of `text` (where the failure usually is)."""
    text = text.strip()
    return text if len(text) <= limit else "…" + text[-limit:]


# -- the steps ---------------------------------------------------------------------------------


def _compile_all(folder: Path) -> tuple[bool, str]:
    problems: list[str] = []
    for path in sorted(folder.rglob("*.py")):
        relative = path.relative_to(folder)
        if any(part.startswith(".") or part == "__pycache__" for part in relative.parts):
            continue
        try:
            compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        except SyntaxError as exc:
            problems.append(f"{relative}:{exc.lineno}: {exc.msg}")
        except (ValueError, OSError) as exc:
            problems.append(f"{relative}: {exc}")
    return not problems, "\n".join(problems)


async def _run(argv: list[str], cwd: Path, env: Mapping[str, str],
               limit_s: float) -> tuple[int | None, str]:
    """Run a child in its own session; (exit code or None on timeout, stdout and stderr)."""
    proc = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env={**os.environ, **SAFE_PATH, **env}, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        start_new_session=True)
    try:
        async with asyncio.timeout(limit_s):
            out, _ = await proc.communicate()
    except TimeoutError:
        await _kill(proc)
        return None, ""
    return proc.returncode, out.decode(errors="replace")


async def _kill(proc: asyncio.subprocess.Process) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    await proc.wait()


class MissingTools(PulseError):
    """Tools the promote gate runs (git, mypy, pytest) are not installed; lists every one."""


GATE_MODULES = ("mypy", "pytest")
PYTHON = (sys.executable, "-P")
"""How the gate starts Python: this interpreter, with nothing of its working directory on
sys.path."""
SAFE_PATH = {"PYTHONSAFEPATH": "1"}
"""The same (-P) for every Python the gate's children start in turn."""


def tool_problems() -> dict[str, str]:
    """What the gate needs and cannot find, by tool name: git on PATH, and mypy and pytest
    importable by this interpreter (the gate runs `python -m mypy` and `python -m pytest`)."""
    problems: dict[str, str] = {}
    if shutil.which("git") is None:
        problems["git"] = "git is not on PATH — install git from your system's packages"
    for module in GATE_MODULES:
        if importlib.util.find_spec(module) is None:
            problems[module] = (f"{module} is not installed for {sys.executable} — "
                                f"`{sys.executable} -m pip install {module}`")
    return problems


def require_tools() -> None:
    """Raise MissingTools naming every tool the gate needs and cannot find."""
    problems = tool_problems()
    if problems:
        raise MissingTools("the promote gate cannot run: " + "; ".join(problems.values())
                           + " (`upulse doctor` checks everything promote and the daemon need)")


def _source_paths() -> dict[str, str]:
    """PYTHONPATH and MYPYPATH that let children find pulse when it runs from a source folder.

    An installed pulse is in site-packages, which children search anyway (and mypy refuses
    in MYPYPATH); a source checkout or an editable install is only found through its folder.
    """
    root = Path(pulse_core.__file__).resolve().parent.parent
    if root.name in ("site-packages", "dist-packages"):
        return {}
    return {name: os.pathsep.join([str(root), *filter(None, [os.environ.get(name)])])
            for name in ("PYTHONPATH", "MYPYPATH")}


async def _mypy(staging: Path, home: Path, limit_s: float) -> tuple[bool, str]:
    cache = Path(os.environ.get("MYPY_CACHE_DIR") or home / "cache" / "mypy")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    await asyncio.to_thread(cache.mkdir, parents=True, exist_ok=True)
    try:
        async with exclusive_lock(cache / MYPY_LOCK_NAME, limit_s, "another gate's mypy"):
            code, out = await _run(
                [*PYTHON, "-m", "mypy", "--strict", "--cache-dir", str(cache),
                 staging.name], staging.parent, _source_paths(), deadline - loop.time())
    except LockBusy as exc:
        return False, str(exc)
    if code is None:
        return False, f"mypy did not finish within {limit_s:g} s"
    return code == 0, out


async def _tests(staging: Path, limit_s: float) -> tuple[bool, str]:
    code, out = await _run([*PYTHON, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "--import-mode=importlib", "--rootdir", str(staging)],
                           staging, {**_source_paths(), "PYTHONDONTWRITEBYTECODE": "1"},
                           limit_s)
    if code is None:
        return False, f"the engine's tests did not finish within {limit_s:g} s"
    if code == 5:  # pytest: no tests were collected
        return True, out + "\n(the engine has no tests)"
    return code == 0, out


# -- the dry run -------------------------------------------------------------------------------


async def _read_marked(stream: asyncio.StreamReader, chatter: list[str]) -> dict[str, Any]:
    """The next message the child marked for the gate; other lines go to `chatter`."""
    while True:
        line = await stream.readline()
        if not line:
            return {"stage": "failed", "message": "the dry-run process exited early"}
        text = line.decode(errors="replace").rstrip("\n")
        if text.startswith(_MARK):
            message: dict[str, Any] = json.loads(text[len(_MARK):])
            return message
        chatter.append(text)
        del chatter[:-200]


async def _dry_run(staging: Path, home: Path, tick_s: float,
                   open_s: float) -> tuple[bool, str]:
    with tempfile.TemporaryDirectory(prefix="upulse-gate-") as tmp:
        scratch = Path(tmp) / "home"
        scratch.mkdir()
        await asyncio.to_thread(copy_live_home, Home(home), HomeLayout(scratch))
        proc = await asyncio.create_subprocess_exec(
            *PYTHON, "-m", "pulse_cli.gate", "dry-run", str(staging), str(scratch),
            str(tick_s), cwd=tmp,
            env={**os.environ, **SAFE_PATH, **_source_paths(), "PYTHONDONTWRITEBYTECODE": "1"},
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        assert proc.stdout is not None
        chatter: list[str] = []
        try:
            try:
                async with asyncio.timeout(open_s):
                    message = await _read_marked(proc.stdout, chatter)
                if message["stage"] == "opened":
                    async with asyncio.timeout(tick_s + _DEADLINE_GRACE_S):
                        message = await _read_marked(proc.stdout, chatter)
            except TimeoutError:
                await _kill(proc)
                return False, bounded("\n".join([
                    f"the staged chain did not return a Decision within {tick_s:g} s (the "
                    "dry-run process was killed)", *chatter]))
            try:
                async with asyncio.timeout(30):
                    await proc.communicate()
            except TimeoutError:
                await _kill(proc)
        finally:
            if proc.returncode is None:
                await _kill(proc)
    return _verdict(message, chatter)


def _verdict(message: Mapping[str, Any], chatter: list[str]) -> tuple[bool, str]:
    if message["stage"] != "ticked":
        return False, bounded("\n".join([*chatter, str(message.get("message", message))]))
    summary = (f"decision: {len(message['effects'])} effect(s) {message['effects']}, "
               f"tick_ms {message['tick_ms']}")
    errors = [f"{e['origin']}: {e['type']}: {e['message']}" for e in message["errors"]]
    if errors:
        return False, bounded("\n".join(["staged rules recorded errors in the dry-run tick:",
                                         *errors, summary]))
    if message["unhandled"]:
        return False, bounded("\n".join([
            f"the dry-run tick emitted effects no executor handles: "
            f"{', '.join(message['unhandled'])} — add an executor for them to LAYER's "
            "executors (or configure a layer that has one)", summary]))
    return True, summary


# -- the gate ----------------------------------------------------------------------------------


async def run_gate(staging: Path, home: Path, *, dry_run_timeout_s: float = 5.0,
                   step_timeout_s: float = STEP_TIMEOUT_S,
                   open_timeout_s: float = OPEN_TIMEOUT_S,
                   backtest_ticks: int = BACKTEST_TICKS, max_diff: int | None = None,
                   progress: Callable[[str], None] | None = None) -> tuple[GateStep, ...]:
    """Run the gate on the engine directory `staging`, dry-running and backtesting (over
    the last `backtest_ticks` recorded ticks, refusing a diff of more than `max_diff`
    effects; None: any) against `home`.

    Returns the steps that ran: all five when the code passes, else up to the one that
    failed (the last). `progress` hears a line as each step starts and one as it ends
    (the backtest's lines after it).
    Writes nothing to `home` but the mypy cache (HOME/cache/mypy, or $MYPY_CACHE_DIR),
    which one gate's mypy uses at a time.
    """
    steps: list[Callable[[], Awaitable[tuple[bool, str] | tuple[bool, str, Backtest | None]]]] = [
        lambda: asyncio.to_thread(_compile_all, staging),
        lambda: _mypy(staging, home, step_timeout_s),
        lambda: _tests(staging, step_timeout_s),
        lambda: _dry_run(staging, home, dry_run_timeout_s, open_timeout_s),
        lambda: run_backtest(staging, home, ticks=backtest_ticks, max_diff=max_diff,
                             limit_s=step_timeout_s, run=_run, python=PYTHON,
                             env={**_source_paths(), "PYTHONDONTWRITEBYTECODE": "1"}),
    ]
    done: list[GateStep] = []
    for name, step in zip(GATE_STEPS, steps, strict=True):
        if progress is not None:
            progress(f"running {name} …")
        started = time.monotonic()
        ok, output, *more = await step()
        done.append(GateStep(name, ok, round(time.monotonic() - started, 3), bounded(output),
                             more[0] if more else None))
        if progress is not None:
            progress(str(done[-1]))
            if ok and done[-1].backtest is not None:  # a refusal's output says it
                for line in done[-1].backtest.lines():
                    progress(f"  {line}")
        if not ok:
            break
    return tuple(done)


# -- the dry-run child ---------------------------------------------------------------------


def _say(message: Mapping[str, Any]) -> None:
    print(_MARK + json.dumps(message), flush=True)


async def _tick_once(engine_dir: Path, scratch: Path, tick_s: float) -> dict[str, Any]:
    from pulse_cli.assembly import build_engine, load_code  # the child's

    cfg = config_file.on_scratch(config_file.load_or_default(Home(scratch).config))
    code = load_code(engine_dir, staged=True)
    engine = build_engine(scratch, cfg, code, rule_timeout=tick_s, drain_timeout=0.5)
    names = {rule_name(r) for r in engine.business.rules} | {"business-rules"}
    handled = {t.tag() for executor in engine.executors for t in executor.handles}
    await engine.open()
    try:
        await engine.sample()
        _say({"stage": "opened"})
        since = await engine.events.last_seq()
        decision = await engine.tick()
        errors = [{"origin": e.origin, "type": e.data.get("type"),
                   "message": e.data.get("message")}
                  for e in await engine.events.read(since, kinds=["error"])
                  if e.origin.startswith("rule:") and e.origin.removeprefix("rule:") in names]
        emitted = [type(e).tag() for e in decision.effects]
        unhandled = sorted({type(e).tag() for e in decision.effects
                            if not isinstance(e, Mark) and type(e).tag() not in handled})
        return {"stage": "ticked", "effects": emitted, "tick_ms": decision.tick_ms,
                "errors": errors, "unhandled": unhandled}
    finally:
        await engine.close()


def _child(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] != "dry-run":
        print("usage: python -m pulse_cli.gate dry-run ENGINE_DIR SCRATCH_HOME TIMEOUT_S",
              file=sys.stderr)
        return 2
    try:
        _say(asyncio.run(_tick_once(Path(argv[1]), Path(argv[2]), float(argv[3]))))
    except Exception as exc:  # a staged rule, or the Engine refusing the staged chain
        trace = "".join(traceback.format_exception(exc)[-6:])
        _say({"stage": "failed", "message": f"{type(exc).__name__}: {exc}\n{trace}"})
    return 0


if __name__ == "__main__":
    sys.exit(_child(sys.argv[1:]))
