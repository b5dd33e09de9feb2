"""Another process holding a SQLite file's write lock, as a second program writing to the
same events.db would: until `release()`, or for at most `hold_s` seconds."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HOLDER = """
import select, sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
select.select([sys.stdin], [], [], float(sys.argv[2]))  # a line on stdin: release now
conn.execute("ROLLBACK")
"""


class WriteLock:
    """A process that holds `db`'s write lock from construction (it returns once the lock is
    held) until `release()`, or `hold_s` seconds at most."""

    def __init__(self, db: Path, hold_s: float = 60.0) -> None:
        self.process = subprocess.Popen([sys.executable, "-c", HOLDER, str(db), str(hold_s)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line == "locked\n", f"the lock holder said {line!r}"

    def release(self, timeout_s: float = 30.0) -> None:
        """Let the lock go now (if it is still held) and wait for the process to end."""
        if self.process.poll() is None:
            assert self.process.stdin is not None
            try:
                self.process.stdin.write("\n")
                self.process.stdin.flush()
            except BrokenPipeError:
                pass  # it let go on its own just now
        assert self.process.wait(timeout_s) == 0

    def ended(self, timeout_s: float = 30.0) -> None:
        """Wait for the holder to let go on its own (`hold_s`)."""
        assert self.process.wait(timeout_s) == 0
