"""Events, drafts, the kinds catalogue and the payload codec.

An `Event` is one immutable row of events.db. Callers write `EventDraft`s; the store gives
them their seq, id, version, timestamp and transaction. Every kind that enters the log is in
the catalogue, so the log documents itself and a typo fails loudly instead of vanishing.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
import traceback
from collections.abc import Iterable, Mapping
from typing import Any, Literal, TypeVar

import msgspec

from pulse_core._errors import InvalidEvent, PayloadNotEncodable, UnknownKind
from pulse_core._pmap import PersistentMap
from pulse_core._redact import redact_urls

T = TypeVar("T")

_KIND_RE = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")
_ORIGIN_RE = re.compile(r"^(watcher|rule|executor|engine|agent|human|survival|cli)(:[^\s]+)?$")
MAX_KEY_LENGTH = 512


class Event(msgspec.Struct, frozen=True, gc=False):
    """One stored event: immutable, numbered by `seq`, versioned per `key`."""

    seq: int
    id: str
    kind: str
    key: str
    version: int
    ts: int
    origin: str
    cause: int | None
    tx: str
    idem: str | None
    data: Any
    hash: str | None

    def payload(self, type: type[T]) -> T:
        """The data converted to `type` (a Struct, dataclass, TypedDict...), validated."""
        try:
            return msgspec.convert(self.data, type)
        except msgspec.ValidationError as exc:
            raise InvalidEvent(f"event #{self.seq} ({self.kind}): {exc}") from None


class EventDraft(msgspec.Struct, frozen=True):
    """An event as a caller proposes it; the store fills in the rest on append.

    `attachment` bytes go to the content-addressed object store and the event keeps their
    digest in `hash`. `idem` makes the draft idempotent: appending the same idem and content
    again returns the stored event instead of writing a new one.
    """

    kind: str
    key: str
    data: Any = None
    origin: str = "agent"
    cause: int | None = None
    idem: str | None = None
    attachment: bytes | None = None


class KindSpec(msgspec.Struct, frozen=True):
    """A catalogue entry: what the kind means and, optionally, the shape of its data."""

    name: str
    doc: str
    payload: Any = None


_catalogue: dict[str, KindSpec] = {}
_catalogue_lock = threading.Lock()


def register_kind(name: str, doc: str, payload: Any = None) -> KindSpec:
    """Add a kind to the catalogue; `payload` (a type) validates data on append.

    Registering the same name again with the same payload type is a no-op.
    """
    if not _KIND_RE.match(name):
        raise InvalidEvent(f"kind {name!r} is not kebab-case (like 'task-created')")
    spec = KindSpec(name, doc, payload)
    with _catalogue_lock:
        old = _catalogue.get(name)
        if old is not None and old.payload is not payload:
            raise InvalidEvent(f"kind {name!r} is already registered with another payload type")
        _catalogue.setdefault(name, spec)
    return _catalogue[name]


def known_kinds() -> dict[str, KindSpec]:
    """A copy of the catalogue, by kind name."""
    with _catalogue_lock:
        return dict(_catalogue)


def require_kind(kind: str) -> KindSpec:
    """The catalogue entry for `kind`, or UnknownKind naming similar kinds."""
    spec = _catalogue.get(kind)
    if spec is None:
        raise UnknownKind(kind, _catalogue)
    return spec


def _enc_hook(obj: Any) -> Any:
    if isinstance(obj, PersistentMap):
        return dict(obj.items())
    raise TypeError(f"Encoding objects of type {type(obj).__name__} is unsupported")


_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)
_decoder = msgspec.json.Decoder()

MAX_DATA_DEPTH = 64
"""How deeply lists, tuples and mappings may nest in stored data."""

_PLAIN = frozenset({str, int, bool, type(None)})
_BYTES = (bytes, bytearray, memoryview)


def _unencodable(where: str, exc: BaseException) -> PayloadNotEncodable:
    if isinstance(exc, RecursionError):
        return PayloadNotEncodable(f"{where}: nested deeper than {MAX_DATA_DEPTH} levels — "
                                   "flatten it, or store it as an attachment")
    return PayloadNotEncodable(f"{where}: cannot encode as JSON — {exc}")


def _check_plain(value: Any, where: str, depth: int = 1) -> None:
    """Refuse what JSON cannot hold faithfully: NaN and infinities (msgspec writes null),
    bytes (msgspec writes base64 text) and nesting deeper than MAX_DATA_DEPTH (so this
    recursion stays shallow)."""
    kind = type(value)
    if kind in _PLAIN:
        return
    container = kind is dict or kind is list or kind is tuple  # the usual data: asked first
    if not container:
        if isinstance(value, float):
            if not math.isfinite(value):
                raise PayloadNotEncodable(f"{where}: {value!r} is not a JSON number — store "
                                          "null, a string or a flag that says what it meant")
            return
        if isinstance(value, (str, int)):
            return
        if isinstance(value, _BYTES):
            raise PayloadNotEncodable(f"{where}: bytes are not JSON — give them as the "
                                      "draft's attachment, or encode them as text yourself")
    if depth > MAX_DATA_DEPTH:
        raise _unencodable(where, RecursionError())
    finite = math.isfinite
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str:
                _check_plain(key, where, depth)
            item_kind = type(item)
            if item_kind not in _PLAIN and not (item_kind is float and finite(item)):
                _check_plain(item, where, depth + 1)
    elif container:
        for item in value:
            item_kind = type(item)
            if item_kind not in _PLAIN and not (item_kind is float and finite(item)):
                _check_plain(item, where, depth + 1)
    else:  # a Struct, dataclass, set, datetime...: checked as msgspec would write it
        try:
            plain = msgspec.to_builtins(value, builtin_types=_BYTES, enc_hook=_enc_hook)
        except (TypeError, ValueError, OverflowError, RecursionError) as exc:
            raise _unencodable(where, exc) from None
        _check_plain(plain, where, depth)  # builtins only now: dict, list, tuple, scalars


def encode_data(data: Any, where: str = "payload") -> bytes:
    """msgspec JSON bytes of `data`, or PayloadNotEncodable naming `where`: for what msgspec
    cannot encode, NaN, infinities, bytes, and nesting deeper than MAX_DATA_DEPTH."""
    _check_plain(data, where)
    try:
        return _encoder.encode(data)
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise _unencodable(where, exc) from None


def decode_data(raw: bytes | None) -> Any:
    """The Python value of stored JSON bytes (None for no data)."""
    return None if raw is None else _decoder.decode(raw)


MAX_SEQ = 2**63 - 1
"""The largest seq (SQLite's largest integer)."""


def check_text(value: object, what: str, where: str) -> str:
    """`value` if it is a str that every backend can store (UTF-8, so no lone surrogates;
    no NUL character, which PostgreSQL text cannot hold); else InvalidEvent naming `what`
    and `where`."""
    if not isinstance(value, str):
        raise InvalidEvent(f"{where}: {what} must be a str, not {type(value).__name__}")
    if "\0" in value:
        raise InvalidEvent(f"{where}: {what} holds a NUL character at position "
                           f"{value.index(chr(0))}, which a PostgreSQL log cannot store — "
                           "remove it")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidEvent(f"{where}: {what} holds {value[exc.start]!r} at position "
                           f"{exc.start}, a lone surrogate that UTF-8 cannot store") from None
    return value


def check_draft(draft: EventDraft, index: int = 0) -> bytes:
    """Validate every field of one draft (types, ranges, the catalogue) and return its
    encoded data."""
    if not isinstance(draft, EventDraft):
        raise InvalidEvent(f"draft {index}: expected EventDraft, got {type(draft).__name__}")
    kind, key, origin = draft.kind, draft.key, draft.origin
    # Every catalogued kind is kebab-case (register_kind checks it): found, it needs no regex.
    spec = _catalogue.get(kind) if type(kind) is str else None
    if spec is None:
        if not isinstance(kind, str) or not _KIND_RE.match(kind):
            raise InvalidEvent(f"{_where(draft, index)}: kind is not kebab-case (like "
                               "'task-created')")
        spec = require_kind(kind)
    if not _plain_text(key):
        check_text(key, "key", _where(draft, index))
    if not key or len(key) > MAX_KEY_LENGTH:
        raise InvalidEvent(f"{_where(draft, index)}: key must be 1..{MAX_KEY_LENGTH} characters")
    if type(origin) is not str or origin not in _good_origins:
        _check_origin(origin, _where(draft, index))
    cause = draft.cause
    if cause is not None and (not isinstance(cause, int) or isinstance(cause, bool)
                              or not 0 < cause <= MAX_SEQ):
        raise InvalidEvent(f"{_where(draft, index)}: cause {cause!r} must be the seq of an "
                           f"event (an int from 1 to {MAX_SEQ}) or None")
    if draft.idem is not None and not _plain_text(draft.idem):
        check_text(draft.idem, "idem", _where(draft, index))
    if draft.attachment is not None and not isinstance(draft.attachment, bytes):
        raise InvalidEvent(f"{_where(draft, index)}: attachment must be bytes, not "
                           f"{type(draft.attachment).__name__}")
    try:
        raw = encode_data(draft.data, "")
    except PayloadNotEncodable as exc:  # its text starts ": ", after the empty place
        raise PayloadNotEncodable(f"{_where(draft, index)}{exc}") from None
    if spec.payload is not None:
        try:
            msgspec.json.decode(raw, type=spec.payload)
        except msgspec.ValidationError as exc:
            raise InvalidEvent(f"{_where(draft, index)}: data does not match {spec.name}: "
                               f"{exc}") from None
    return raw


def _where(draft: EventDraft, index: int) -> str:
    """Where a draft's error lies, as its messages name it (built only for an error)."""
    return f"draft {index} ({draft.kind!r} on {draft.key!r})"


def _plain_text(value: object) -> bool:
    """True for a str that check_text passes at a glance: ASCII (so valid UTF-8), no NUL."""
    return type(value) is str and value.isascii() and "\0" not in value


# Origins already found valid: checking one is a regex and a UTF-8 pass, and a log has few.
_good_origins: set[str] = set()
_GOOD_ORIGINS_KEPT = 1_024


def _check_origin(origin: object, where: str) -> None:
    """InvalidEvent unless `origin` is a valid origin; remembered once it is."""
    if not isinstance(origin, str) or not _ORIGIN_RE.match(origin):
        raise InvalidEvent(
            f"{where}: origin {origin!r} must be agent, human, survival, cli, "
            "or watcher:/rule:/executor:/engine: followed by a name"
        )
    check_text(origin, "origin", where)
    if len(_good_origins) >= _GOOD_ORIGINS_KEPT:
        _good_origins.clear()
    _good_origins.add(origin)


class _Uuid7:
    """UUIDv7 (RFC 9562) with a 12-bit counter, so ids from one process sort in call order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = 0
        self._counter = 0

    def __call__(self) -> str:
        return self.many(1)[0]

    def many(self, count: int) -> list[str]:
        """`count` new ids in call order: one clock read, one lock and one read of the
        system's randomness for them all (an append's ids cost a fraction of one call each)."""
        rand = os.urandom(8 * count + 2).hex()  # 62 random bits an id, then a counter start
        with self._lock:
            ms = time.time_ns() // 1_000_000
            if ms <= self._last_ms:
                ms, counter = self._last_ms, self._counter + 1
            else:
                counter = int(rand[-4:], 16) & 0x3FF
            stamps: list[tuple[int, range]] = []
            while count > 0:
                if counter > 0xFFF:  # the counter ran out: borrow the next millisecond
                    ms, counter = ms + 1, 0
                take = min(count, 0x1000 - counter)
                stamps.append((ms, range(counter, counter + take)))
                counter += take
                count -= take
            self._last_ms, self._counter = ms, counter - 1
        ids: list[str] = []
        at = 0
        for ms, counters in stamps:
            head = f"{ms:012x}"
            head = f"{head[:8]}-{head[8:]}-7"
            for counter in counters:
                ids.append(f"{head}{_COUNTERS[counter]}-{_VARIANT[rand[at]]}"
                           f"{rand[at + 1:at + 4]}-{rand[at + 4:at + 16]}")
                at += 16
        return ids


# The first hex digit of an id's fourth group: two random bits under the variant bits 10.
_VARIANT = {digit: "89ab"[int(digit, 16) & 3] for digit in "0123456789abcdef"}
# The counter's three hex digits, by counter (a format spec per id costs more than the id).
_COUNTERS = [f"{counter:03x}" for counter in range(0x1000)]
uuid7 = _Uuid7()
"""A new time-ordered UUIDv7 string, monotonic within this process."""


def error_draft(where: str, exc: BaseException,
                extra: Mapping[str, Any] | None = None, *, host: str = "") -> EventDraft:
    """The `error` event that records `exc` raised at `where` (key and origin follow `where`;
    `extra` adds fields such as the file and line of broken code; `host` names the host it
    happened on, where engines of several hosts share the log). URLs in the message and
    trace are cut to scheme and host: the log is never scrubbed."""
    data: dict[str, Any] = {
        "where": where, "type": type(exc).__name__, "message": redact_urls(str(exc)),
        "trace": redact_urls("".join(traceback.format_exception(exc)[-3:]))[-2000:],
        **(extra or {})}
    if host:
        data["host"] = host
    engine = where.startswith(("engine", "service:", "layer:"))
    return EventDraft("error", where, data, origin="engine" if engine else where)


def _register_builtin(entries: Iterable[tuple[str, str]]) -> None:
    for name, doc in entries:
        register_kind(name, doc)


_register_builtin(
    [
        ("tick", "a tick that produced effects or errors; data: number, tick_ms, effects, "
                 "errors, seen_seq; hash: its tick record (what it saw and decided)"),
        ("error", "a rule, watcher or loop raised; data: where, type, message"),
        ("effect", "an action described as data, for an executor; key: effect id"),
        ("effect-executing", "an executor claimed an effect; data: attempt, lease_until, "
                             "lease_ms, owner, pid, started"),
        ("effect-acked", "an effect finished; data: attempt, result, duration_ms"),
        ("effect-failed", "an effect attempt failed; data: attempt, error, retry_at or final"),
        ("mark", "a fact a rule recorded about its own state (a counter, a backoff, a "
                 "once-only marker); key: mark:<tag>; data: mark"),
        ("payload-purged", "a content-addressed payload was deleted; key: its digest"),
        ("engine-started", "an engine opened this home; data: pid, owner, host, heartbeat_ms"),
        ("engine-stopped", "an engine closed this home cleanly; data: pid, interrupted, owner"),
        ("promote", "staged business rules were promoted; data: revision"),
        ("rollback", "business rules were rolled back; data: revision, reason"),
        ("checkpoint-discarded", "a checkpoint reflected more of the log than the log holds "
                                 "and was rebuilt; key: checkpoint:<name>; data: name, seq, "
                                 "last_seq"),
    ]
)


QUARANTINED = "event-quarantined"
"""The kind that marks a stored row unreadable (see Quarantined)."""


class Quarantined(msgspec.Struct, frozen=True):
    """The data of an `event-quarantined` event: the row `seq` (its `kind`, `key` and
    `version`) cannot be read and every read leaves it out.

    The event is stored under the row's own key, so the key's version moves past the row: a
    fold that reads this kind beside its own keeps the version writers must expect."""

    seq: int
    kind: str
    key: str
    reason: str
    version: int = 0


register_kind(QUARANTINED, "a stored row cannot be read and every read leaves it out; key: "
                           "the row's key; data: seq, kind, key, version, reason", Quarantined)


class EffectControlled(msgspec.Struct, frozen=True):
    """The data of `effect-cancelled` and `effect-retried`: why an operator cancelled or
    retried the effect, and the status it `was` in (what the append's expected version
    vouches for). Who did it is the event's origin (`human:<who>`)."""

    reason: str
    was: Literal["pending", "retrying", "failed", "cancelled"]


register_kind("effect-cancelled", "an operator cancelled a pending or retrying effect: no "
                                  "executor runs it; key: effect id; data: reason, was",
              EffectControlled)
register_kind("effect-retried", "an operator made a finally failed or cancelled effect "
                                "pending again, its executor's max_attempts counted afresh; "
                                "key: effect id; data: reason, was", EffectControlled)


class ExecutorsAnnounced(msgspec.Struct, frozen=True):
    """The data of `executors-announced`: the effect tags the engines of `host` run, as the
    engine `owner` (its executor loop's owner id) announced them when it opened."""

    host: str
    tags: list[str]
    owner: str = ""


register_kind("executors-announced", "an engine opened and runs these effect types; key: "
                                     "executors@<host>; data: host, tags, owner (the latest "
                                     "of each host counts)", ExecutorsAnnounced)
