"""Helpers for the whole-process tests: child processes, bounded waits, reading events.db."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, TypeVar

import psutil

from pulse_core import Event
from pulse_core._events import decode_data
from tests.timing import scaled

CHILDREN = Path(__file__).resolve().parent / "children"
T = TypeVar("T")


class Child:
    """A child process running one script of tests/e2e/children, its output kept in files."""

    def __init__(self, script: str, args: list[str], workdir: Path) -> None:
        self.name = f"{Path(script).stem}-{len(list(workdir.glob('*.out')))}"
        self.out_path = workdir / f"{self.name}.out"
        self.err_path = workdir / f"{self.name}.err"
        self._out: IO[bytes] = self.out_path.open("wb")
        self._err: IO[bytes] = self.err_path.open("wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILDREN / script), *args],
            stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL,
        )

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def lines(self) -> list[str]:
        return self.out_path.read_text().splitlines()

    def describe(self) -> str:
        """Exit status and output, for assertion messages."""
        status = "running" if self.alive() else f"exited {self.proc.returncode}"
        return (f"\n--- child {self.name} (pid {self.pid}, {status})\nstdout:\n"
                f"{self.out_path.read_text()}\nstderr:\n{self.err_path.read_text()[-4000:]}")

    def wait_for_line(self, prefix: str, timeout: float) -> str:
        """The first stdout line starting with `prefix`, waiting up to `timeout` seconds."""
        return wait_until(
            lambda: next((line for line in self.lines() if line.startswith(prefix)), None),
            timeout, f"{self.name} to print {prefix!r}", self,
        )

    def kill(self, reap: bool = True) -> None:
        """SIGKILL, then reap the child (or, with `reap=False`, wait until it is a zombie:
        dead, but its pid still taken until this process reaps it)."""
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
        if reap:
            self.proc.wait(timeout=scaled(10))
            return
        # waitable = every thread has exited (and released its locks); WNOWAIT keeps it so.
        flags = os.WEXITED | os.WNOWAIT | os.WNOHANG
        wait_until(lambda: os.waitid(os.P_PID, self.pid, flags), 10,
                   f"{self.name} to have exited")
        assert psutil.Process(self.pid).status() == psutil.STATUS_ZOMBIE

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM and wait (`timeout` seconds, scaled) for the exit code."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        timeout = scaled(timeout)
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{self.name} ignored SIGTERM for {timeout:g} s"
                                 f"{self.describe()}") from None

    def close(self) -> None:
        if self.alive():
            self.kill()
        self._out.close()
        self._err.close()


def wait_until(
    probe: Callable[[], T | None], timeout: float, what: str, *children: Child
) -> T:
    """Poll `probe` until it returns something truthy; fail after `timeout` seconds (scaled:
    it bounds a hang), or as soon as one of `children` has died."""
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        fail_if_stuck(deadline, timeout, what, children)
        time.sleep(0.02)


def fail_if_stuck(deadline: float, timeout: float, what: str, children: Sequence[Child]
                  ) -> None:
    """AssertionError, with what `children` said, once one of them has died or the
    `deadline` (time.monotonic) of a `timeout`-second wait for `what` has passed."""
    fail_if_dead(what, children)
    if time.monotonic() > deadline:
        raise AssertionError(f"timed out after {timeout:g} s waiting for {what}"
                             + "".join(c.describe() for c in children))


def fail_if_dead(what: str, children: Sequence[Child]) -> None:
    """AssertionError, with what they said, once one of `children` has died."""
    dead = [c for c in children if not c.alive()]
    if dead:
        raise AssertionError(f"a child died while waiting for {what}"
                             + "".join(c.describe() for c in dead))


def read_events(db: Path, kinds: set[str] | None = None) -> list[Event]:
    """Every event in `db` (or those of `kinds`), in seq order, read with plain sqlite3."""
    if not db.exists():
        return []
    conn = sqlite3.connect(db, timeout=10.0)
    try:
        conn.execute("PRAGMA query_only=ON")
        try:
            rows = conn.execute(
                "SELECT seq, id, kind, key, version, ts, origin, cause, tx, idem, data, hash "
                "FROM events ORDER BY seq").fetchall()
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                return []
            raise
    finally:
        conn.close()
    events = [Event(seq=r[0], id=r[1], kind=r[2], key=r[3], version=r[4], ts=r[5], origin=r[6],
                    cause=r[7], tx=r[8], idem=r[9], data=decode_data(r[10]), hash=r[11])
              for r in rows]
    return [e for e in events if kinds is None or e.kind in kinds]


def check_database(db: Path) -> None:
    """Assert `db` passes SQLite's integrity check and its seq has no gaps."""
    conn = sqlite3.connect(db, timeout=10.0)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        count, top = conn.execute("SELECT count(*), coalesce(max(seq), 0) FROM events").fetchone()
    finally:
        conn.close()
    assert count == top, f"seq has gaps: {count} events, max seq {top}"


def by_key(events: list[Event]) -> dict[str, list[Event]]:
    """Events grouped by key, each group in seq order."""
    groups: dict[str, list[Event]] = {}
    for event in events:
        groups.setdefault(event.key, []).append(event)
    return groups


def assert_every_effect_finished_once(events: list[Event]) -> None:
    """Every `effect` in `events` has exactly one terminal event: an ack or a final failure."""
    effects = {e.key for e in events if e.kind == "effect"}
    terminal = Counter(e.key for e in events
                       if e.kind == "effect-acked"
                       or (e.kind == "effect-failed" and e.data.get("final")))
    unfinished = sorted(effects - set(terminal))
    twice = sorted(key for key, count in terminal.items() if count > 1)
    assert not unfinished and not twice, f"unfinished: {unfinished}, finished twice: {twice}"
