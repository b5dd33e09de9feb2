"""How commands print: aligned tables and relative times for people, JSON for machines.

Everything printed for people goes through `printable` (tables and `clip` do it for their
cells), so text from the log, a config file or a daemon's log never reaches the terminal as
a control sequence.
"""

from __future__ import annotations

import difflib
import re
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from pulse_core import PersistentMap


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, PersistentMap):
        return dict(obj.items())
    if isinstance(obj, frozenset | set):
        return sorted(obj)
    raise TypeError(f"cannot print {type(obj).__name__} as JSON")


_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)

# C0 controls, DEL and C1 controls (ESC and CSI among them) -> a visible \xNN escape.
_ESCAPES = {code: f"\\x{code:02x}" for code in (*range(0x20), *range(0x7F, 0xA0))}
_ESCAPES_BUT_NEWLINES = {code: text for code, text in _ESCAPES.items() if code != 0x0A}


# A URL's password: between `scheme://user:` and the last '@' ahead of the host, or a
# `password=` option in its query.
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/@\"'<>]*):[^\s\"'<>]*@")
_QUERY_PASSWORD = re.compile(r"(?P<head>[?&]password=)[^&#\s\"'<>]*", re.IGNORECASE)


def without_passwords(text: str) -> str:
    """`text` with the password of every URL in it cut out (`postgresql://ada@db/pulse`
    for `postgresql://ada:secret@db/pulse`); the user, host, port and database stay, so a
    message still says which database it means."""
    return _QUERY_PASSWORD.sub(r"\g<head>…", _URL_PASSWORD.sub(r"\g<head>@", text))


def printable(text: str, *, newlines: bool = False) -> str:
    """`text` safe for a terminal: each control character (C0, DEL, C1; ESC among them)
    written as a visible `\\xNN`, every other character as it is; with `newlines`, line
    breaks stay."""
    return text.translate(_ESCAPES_BUT_NEWLINES if newlines else _ESCAPES)


def nearest(value: str, known: Iterable[str]) -> str | None:
    """The one of `known` closest to `value` when one is close enough to be a typo of it."""
    close = difflib.get_close_matches(value, sorted(known), n=1)
    return close[0] if close else None


def did_you_mean(value: str, known: Iterable[str]) -> str:
    """` — did you mean 'x'?` naming the nearest of `known` to `value`, else an empty string."""
    close = nearest(value, known)
    return "" if close is None else f" — did you mean {close!r}?"


def to_json(value: Any) -> str:
    """`value` as compact JSON text (Structs, PersistentMaps and sets included)."""
    return _encoder.encode(value).decode()


def print_json(value: Any) -> None:
    """Print `value` as one indented JSON document."""
    sys.stdout.write(msgspec.json.format(_encoder.encode(value), indent=2).decode() + "\n")


def print_json_line(value: Any) -> None:
    """Print `value` as one line of JSON (for streams: one document per line)."""
    sys.stdout.write(to_json(value) + "\n")
    sys.stdout.flush()


def now_ms() -> int:
    """Wall-clock milliseconds, the unit of event timestamps."""
    return time.time_ns() // 1_000_000


def span(seconds: float) -> str:
    """A duration the way a person says it: 45s, 3m 05s, 2h 10m, 4d 3h."""
    whole = int(max(seconds, 0))
    if whole < 60:
        return f"{whole}s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes}m {secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h {minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d {hours}h"


def ago(ts_ms: int | None, now: int | None = None) -> str:
    """How long ago `ts_ms` was ("3s ago", "2h 10m ago"; "in 5s" for the future; "-" for none)."""
    if ts_ms is None:
        return "-"
    delta = ((now if now is not None else now_ms()) - ts_ms) / 1000
    if delta < 0:
        return f"in {span(-delta)}"
    return f"{span(delta)} ago"


def clip(text: str, width: int) -> str:
    """`text` on one line and `printable`, cut to `width` characters with an ellipsis."""
    flat = printable(" ".join(text.split()))
    return flat if len(flat) <= width else flat[: max(width - 1, 0)] + "…"


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """An aligned plain-text table of `printable` cells; the last column is not padded."""
    cells = [[printable(str(c)) for c in row] for row in (headers, *rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = []
    for row in cells:
        padded = [c.ljust(w) for c, w in zip(row[:-1], widths, strict=False)]
        lines.append("  ".join([*padded, row[-1]]).rstrip())
    return "\n".join(lines)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], empty: str) -> None:
    """Print a table, or `empty` when there are no rows."""
    print(table(headers, rows) if rows else empty)


PROGRESS_EVERY_S = 1.0


class Progress:
    """Progress lines of a long command on stderr (none when `quiet`): each call, and
    `every` at most once a second (the last one held back is printed by `flush`)."""

    def __init__(self, *, quiet: bool) -> None:
        self.quiet = quiet
        self._last = 0.0
        self._held: str | None = None

    def __call__(self, line: str) -> None:
        if not self.quiet:
            print(printable(line), file=sys.stderr, flush=True)

    def every(self, line: str) -> None:
        now = time.monotonic()
        if now - self._last >= PROGRESS_EVERY_S:
            self._last, self._held = now, None
            self(line)
        else:
            self._held = line

    def hold(self) -> None:
        """The next `every` line waits a second: what ends sooner prints nothing."""
        self._last, self._held = time.monotonic(), None

    def drop(self) -> None:
        """Forget the line `every` held back."""
        self._held = None

    def flush(self) -> None:
        if self._held is not None:
            self(self._held)
            self._held = None
