"""The commands that copy a home out and back: `backup`, `restore` and `export`
(docs/backup.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pulse_cli.parsing import command, json_flag
from pulse_cli.queries import parse_count, parse_page

EXIT_CODES = """\
exit codes: 0 done (backup: also for a log on a server, which the output says to dump
with pg_dump), 1 error (a corrupt backup, a DEST or home that is not empty), 3 a daemon or
another engine has the home open (restore)"""


def _absolute(path: Path) -> Path:
    return path.expanduser().absolute()


def add_backup_commands(sub: Any) -> None:
    """Add `backup`, `restore` and `export` to `upulse`'s subparsers `sub`."""
    backup = command(sub, "backup",  "backup.backup",
                     "a consistent snapshot of the home into the new folder DEST, taken while "
                     "the daemon runs (stores, objects, checkpoints, config, engine "
                     "directory; hashed in DEST/manifest.json)",
                     lambda a, h: {"dest": _absolute(a.dest), "as_json": a.json,
                                   "keys_file": a.keys and _absolute(a.keys)})
    backup.epilog = EXIT_CODES
    backup.add_argument("dest", type=Path, metavar="DEST",
                        help="a new (or empty) folder outside the home")
    backup.add_argument("--keys", type=Path, metavar="FILE",
                        help="also write the memory elements' keys (never in DEST) to this "
                             "new file: a purge cannot reach it")
    json_flag(backup, "print the manifest")
    restore = command(sub, "restore", "backup_restore.restore",
                      "make the home again from a backup: verified by hash, the events row by "
                      "row; refused while a daemon runs",
                      lambda a, h: {"source": _absolute(a.source), "force": a.force,
                                    "as_json": a.json,
                                    "keys_file": a.keys and _absolute(a.keys)})
    restore.epilog = EXIT_CODES
    restore.add_argument("source", type=Path, metavar="SRC",
                         help="the folder `upulse backup` wrote")
    restore.add_argument("--force", action="store_true",
                         help="restore over a home that is not empty, keeping it aside as "
                              "HOME.before-restore-TIME")
    restore.add_argument("--keys", type=Path, metavar="FILE",
                         help="the keys file `upulse backup --keys` wrote (default: the keys "
                              "the home already holds)")
    json_flag(restore, "print what was restored as one JSON document")
    export = command(sub, "export", "export.export",
                     "every event of the log as one JSON line each, oldest first "
                     "(`> events.jsonl`)",
                     lambda a, h: {"since": a.since, "kinds": a.kind, "page": a.page})
    export.add_argument("--since", type=parse_count, default=0, metavar="SEQ",
                        help="only events after this seq (default 0: all)")
    export.add_argument("--kind", action="append", metavar="K",
                        help="only this kind (repeat for several)")
    export.add_argument("--page", type=parse_page, default=5_000, metavar="N",
                        help="events read per query (default 5000)")
