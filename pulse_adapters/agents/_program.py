"""A host's program: found on PATH (or at its configured path), new enough, or a clear error.

A host layer checks its program once at engine start, in a service (`ProgramCheck`): a
missing program must not stop the engine. The problem is recorded once as an `error` event
(and logged); the layer's runs then fail finally with the same message, and its dispatcher
hands out nothing, while the rest of the engine runs on.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from pulse_core import PulseError, error_draft

if TYPE_CHECKING:
    from pulse_core import Engine

log = logging.getLogger("pulse.agents")

_VERSION = re.compile(r"\d+(?:\.\d+)+")


class ProgramUnavailable(PulseError):
    """A host's program is missing, cannot run, or is older than the layer needs; the message
    names the config field, what was found, and what to do."""


class Program(msgspec.Struct, frozen=True, kw_only=True):
    """The program a host layer runs, and how to check it.

    `field` is the config field that names it (`layers.cursor.program`); `argv0` its name on
    PATH or its path; `min_version` the oldest version the layer works with ("" for any),
    read as the first dotted number in the output of `argv0 *version_argv`; `env` is set over
    the engine's environment for the check (and its PATH used to find `argv0`);
    `install_hint` says how to install it.
    """

    field: str
    argv0: str
    min_version: str = ""
    version_argv: tuple[str, ...] = ("--version",)
    env: dict[str, str] = {}
    install_hint: str = ""
    timeout_s: float = 20.0


class ProgramStatus(msgspec.Struct, frozen=True):
    """What `check_program` found: the program's path and version, or the problem (None when
    the program is usable)."""

    program: Program
    path: str | None
    version: str | None
    problem: str | None

    @property
    def ok(self) -> bool:
        """Found, ran, and new enough."""
        return self.problem is None


def version_tuple(version: str) -> tuple[int, ...]:
    """`"0.19.0"` as `(0, 19, 0)`, for comparing versions."""
    return tuple(int(part) for part in version.split("."))


def _environment(program: Program) -> dict[str, str]:
    return {**os.environ, **program.env}


def _find(program: Program) -> tuple[str | None, str | None]:
    """(path, problem)."""
    where = program.field
    hint = f"{program.install_hint}, " if program.install_hint else "install it, "
    if os.sep in program.argv0:
        path = Path(program.argv0).expanduser()
        if not path.is_file():
            return None, (f"{where}: {program.argv0} does not exist — {hint}or set {where} to "
                          "the program's path")
        if not os.access(path, os.X_OK):
            return None, f"{where}: {program.argv0} is not executable — chmod +x it, or fix {where}"
        return str(path), None
    found = shutil.which(program.argv0, path=_environment(program).get("PATH"))
    if found is None:
        return None, (f"{where}: `{program.argv0}` was not found on PATH — {hint}or set "
                      f"{where} to its path")
    return found, None


def check_program(program: Program) -> ProgramStatus:
    """Find `program` and read its version (blocking: it runs the program; call it in a
    thread from async code). Whatever goes wrong is the status's problem, never raised: a
    check that raised would leave the program unchecked, and its runs dispatched."""
    try:
        return _check(program)
    except Exception as exc:  # a path the OS refuses, a version past int()'s digit limit...
        where = program.field
        return ProgramStatus(program, None, None, (
            f"{where}: {program.argv0} could not be checked ({type(exc).__name__}: "
            f"{str(exc)[:200]}) — check that {where} names the right program"))


def _check(program: Program) -> ProgramStatus:
    path, problem = _find(program)
    if path is None:
        return ProgramStatus(program, None, None, problem)
    where, shown = program.field, " ".join([path, *program.version_argv])
    try:
        done = subprocess.run([path, *program.version_argv], capture_output=True, text=True,
                              errors="replace", env=_environment(program), check=False,
                              timeout=program.timeout_s, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return ProgramStatus(program, path, None, f"{where}: `{shown}` did not answer within "
                             f"{program.timeout_s:g} s — check that {path} is the right program")
    except OSError as exc:
        return ProgramStatus(program, path, None, f"{where}: `{shown}` could not run: {exc} — "
                             f"fix {where}")
    output = (done.stdout + "\n" + done.stderr).strip()
    if done.returncode != 0:
        tail = output.splitlines()[-1][:200] if output else "no output"
        return ProgramStatus(program, path, None, f"{where}: `{shown}` exited with "
                             f"{done.returncode} ({tail}) — check the install at {path}")
    match = _VERSION.search(output)
    if match is None:
        if not program.min_version:
            return ProgramStatus(program, path, None, None)
        return ProgramStatus(program, path, None, (
            f"{where}: no version in the output of `{shown}` ({output[:120]!r}); "
            f"need {program.min_version} or newer — check that {path} is the right program"))
    version = match.group(0)
    name = Path(path).name
    if program.min_version and version_tuple(version) < version_tuple(program.min_version):
        hint = f" ({program.install_hint})" if program.install_hint else ""
        return ProgramStatus(program, path, version, (
            f"{where}: {name} {version} is older than {program.min_version} — upgrade it"
            f"{hint}, or set {where} to a newer one"))
    return ProgramStatus(program, path, version, None)


class ProgramCheck:
    """A host layer's program, checked once: the layer's service at engine start, and what its
    dispatcher and executor ask before they hand out or run anything.

    As a service (`name`, e.g. "cursor-program") it checks at engine start and, when the
    program is unusable, records the problem once as an `error` event (key `service:<name>`)
    and logs it, then ends; the engine runs on. Installing the program takes an engine
    restart to be seen.
    """

    def __init__(self, program: Program, *, name: str) -> None:
        self.program = program
        self.name = name
        self.status: ProgramStatus | None = None
        self._lock = asyncio.Lock()

    @property
    def problem(self) -> str | None:
        """The known problem (None when usable, or not checked yet)."""
        return None if self.status is None else self.status.problem

    async def check(self) -> ProgramStatus:
        """The program's status, checked at the first call (in a thread)."""
        async with self._lock:
            if self.status is None:
                self.status = await asyncio.to_thread(check_program, self.program)
            return self.status

    async def require(self) -> str:
        """The program's path; ProgramUnavailable with the problem when it is unusable."""
        status = await self.check()
        if status.problem is not None or status.path is None:
            raise ProgramUnavailable(status.problem or f"{self.program.field}: not usable")
        return status.path

    async def __call__(self, engine: Engine) -> None:
        status = await self.check()
        if status.problem is None:
            log.info("pulse: %s: %s %s at %s", self.name, self.program.argv0,
                     status.version or "(version not read)", status.path)
            return
        log.error("pulse: %s: %s", self.name, status.problem)
        draft = error_draft(f"service:{self.name}", ProgramUnavailable(status.problem),
                            host=engine.placement)
        # keyed as a service's error (left out of error_backoff), made by the engine
        await engine.events.append([msgspec.structs.replace(draft, origin="engine")])
