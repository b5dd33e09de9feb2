"""A stalled disk, as this process's SQLite meets it: while a `WriteGate` is shut, every write
SQLite makes to a file (`write` and `pwrite64` of its unix VFS: WAL frames, the database,
journals) waits until the gate opens again, in whichever thread made it. Reads go on.

Used by `bench.stall` and by the tests that show the loop keeps turning while a commit waits
for the disk. The gate swaps SQLite's own system-call hooks (`xSetSystemCall`) through ctypes,
so it needs the libsqlite3 that Python's sqlite3 module is linked to (`WriteGate.available`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sqlite3
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

_PWRITE = ctypes.CFUNCTYPE(ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                           ctypes.c_int64)
_WRITE = ctypes.CFUNCTYPE(ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)


class _Vfs(ctypes.Structure):
    """The head of SQLite's `sqlite3_vfs` (version 3), up to the system-call hooks."""


_Vfs._fields_ = [
    ("iVersion", ctypes.c_int), ("szOsFile", ctypes.c_int), ("mxPathname", ctypes.c_int),
    ("pNext", ctypes.c_void_p), ("zName", ctypes.c_char_p), ("pAppData", ctypes.c_void_p),
    *((name, ctypes.c_void_p) for name in (
        "xOpen", "xDelete", "xAccess", "xFullPathname", "xDlOpen", "xDlError", "xDlSym",
        "xDlClose", "xRandomness", "xSleep", "xCurrentTime", "xGetLastError",
        "xCurrentTimeInt64", "xSetSystemCall", "xGetSystemCall", "xNextSystemCall")),
]
_SET = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_Vfs), ctypes.c_char_p, ctypes.c_void_p)
_GET = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.POINTER(_Vfs), ctypes.c_char_p)


class WriteGate:
    """While entered, SQLite's writes in this process pass while the gate is open and wait
    while it is shut (`shut()`, `open()`); leaving opens it and restores SQLite's hooks.
    `writes_held` counts the writes that had to wait; `held` is set once one did."""

    def __init__(self) -> None:
        self._passing = threading.Event()
        self._passing.set()
        self.writes_held = 0
        self.held = threading.Event()
        self._hooks: list[Any] = []
        name = ctypes.util.find_library("sqlite3")
        if name is None:
            raise OSError("no libsqlite3 to load")
        lib = ctypes.CDLL(name)
        lib.sqlite3_vfs_find.restype = ctypes.POINTER(_Vfs)
        lib.sqlite3_vfs_find.argtypes = [ctypes.c_char_p]
        self._vfs = lib.sqlite3_vfs_find(b"unix")
        if not self._vfs or self._vfs.contents.iVersion < 3:
            raise OSError("SQLite's unix VFS has no system-call hooks here")
        self._set = _SET(self._vfs.contents.xSetSystemCall)
        get = _GET(self._vfs.contents.xGetSystemCall)
        self._pwrite = _PWRITE(get(self._vfs, b"pwrite64"))
        self._write = _WRITE(get(self._vfs, b"write"))

    def _wait(self) -> None:
        if not self._passing.is_set():
            self.writes_held += 1
            self.held.set()
            self._passing.wait()

    def __enter__(self) -> WriteGate:
        def pwrite(fd: int, buf: int, size: int, offset: int) -> int:
            self._wait()
            return int(self._pwrite(fd, buf, size, offset))

        def write(fd: int, buf: int, size: int) -> int:
            self._wait()
            return int(self._write(fd, buf, size))

        self._hooks = [_PWRITE(pwrite), _WRITE(write)]  # kept alive while installed
        for name, hook in zip((b"pwrite64", b"write"), self._hooks, strict=True):
            if self._set(self._vfs, name, ctypes.cast(hook, ctypes.c_void_p)) != 0:
                self._set(self._vfs, None, None)
                raise OSError(f"SQLite refused a hook for {name.decode()}")
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.open()
        self._set(self._vfs, None, None)  # every hook back to SQLite's own

    @property
    def is_shut(self) -> bool:
        """Whether writes wait now."""
        return not self._passing.is_set()

    def shut(self) -> None:
        """From now on, SQLite's writes wait."""
        self._passing.clear()

    def open(self) -> None:
        """Let the waiting writes and every later one through."""
        self._passing.set()

    @staticmethod
    def available() -> bool:
        """Whether a gate holds the writes of Python's sqlite3 module here (the libsqlite3
        ctypes finds is the one it uses)."""
        try:
            gate = WriteGate()
        except OSError:
            return False
        with tempfile.TemporaryDirectory() as folder, gate:
            gate.shut()
            released = threading.Timer(0.05, gate.open)
            released.start()
            conn = sqlite3.connect(Path(folder) / "probe.db", isolation_level=None)
            try:
                conn.execute("CREATE TABLE t (x)")
            finally:
                conn.close()
                released.cancel()
        return gate.writes_held > 0
