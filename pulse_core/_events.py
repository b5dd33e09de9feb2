"""Events, drafts, the kinds catalogue and the payload codec.

An `Event` is one immutable row of events.db. Callers write `EventDraft`s; the store gives
them their seq, id, version, timestamp and transaction. Every kind that enters the log is in
the catalogue, so the log documents itself and a typo fails loudly instead of vanishing.
"""

from __future__ import annotations

import os
import re
import threading
import time
import traceback
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import msgspec

from pulse_core._errors import InvalidEvent, PayloadNotEncodable, UnknownKind
from pulse_core._pmap import PersistentMap

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


def encode_data(data: Any, where: str = "payload") -> bytes:
    """msgspec JSON bytes of `data`, or PayloadNotEncodable naming `where`."""
    try:
        return _encoder.encode(data)
    except (TypeError, ValueError, OverflowError) as exc:
        raise PayloadNotEncodable(f"{where}: cannot encode as JSON — {exc}") from None


def decode_data(raw: bytes | None) -> Any:
    """The Python value of stored JSON bytes (None for no data)."""
    return None if raw is None else _decoder.decode(raw)


def check_draft(draft: EventDraft, index: int = 0) -> bytes:
    """Validate one draft against the catalogue and return its encoded data."""
    where = f"draft {index} ({draft.kind!r} on {draft.key!r})"
    if not isinstance(draft, EventDraft):
        raise InvalidEvent(f"draft {index}: expected EventDraft, got {type(draft).__name__}")
    if not _KIND_RE.match(draft.kind):
        raise InvalidEvent(f"{where}: kind is not kebab-case (like 'task-created')")
    spec = require_kind(draft.kind)
    if not draft.key or len(draft.key) > MAX_KEY_LENGTH:
        raise InvalidEvent(f"{where}: key must be 1..{MAX_KEY_LENGTH} characters")
    if not _ORIGIN_RE.match(draft.origin):
        raise InvalidEvent(
            f"{where}: origin {draft.origin!r} must be agent, human, survival, cli, "
            "or watcher:/rule:/executor:/engine: followed by a name"
        )
    raw = encode_data(draft.data, where)
    if spec.payload is not None:
        try:
            msgspec.json.decode(raw, type=spec.payload)
        except msgspec.ValidationError as exc:
            raise InvalidEvent(f"{where}: data does not match {spec.name}: {exc}") from None
    return raw


class _Uuid7:
    """UUIDv7 (RFC 9562) with a 12-bit counter, so ids from one process sort in call order."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last_ms = 0
        self._counter = 0

    def __call__(self) -> str:
        with self._lock:
            ms = time.time_ns() // 1_000_000
            if ms <= self._last_ms:
                ms = self._last_ms
                self._counter += 1
                if self._counter > 0xFFF:
                    ms += 1
                    self._counter = 0
            else:
                self._counter = int.from_bytes(os.urandom(2), "big") & 0x3FF
            self._last_ms = ms
            counter = self._counter
        rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
        value = (ms << 80) | (0x7 << 76) | (counter << 64) | (0b10 << 62) | rand_b
        h = f"{value:032x}"
        return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"


uuid7 = _Uuid7()
"""A new time-ordered UUIDv7 string, monotonic within this process."""


def error_draft(where: str, exc: BaseException,
                extra: Mapping[str, Any] | None = None) -> EventDraft:
    """The `error` event that records `exc` raised at `where` (key and origin follow `where`;
    `extra` adds fields such as the file and line of broken code)."""
    return EventDraft(
        "error", where,
        {"where": where, "type": type(exc).__name__, "message": str(exc),
         "trace": "".join(traceback.format_exception(exc)[-3:])[-2000:], **(extra or {})},
        origin="engine" if where.startswith("engine") else where,
    )


def _register_builtin(entries: Iterable[tuple[str, str]]) -> None:
    for name, doc in entries:
        register_kind(name, doc)


_register_builtin(
    [
        ("tick", "a tick that produced effects or errors; data: number, tick_ms, effects, "
                 "errors, seen_seq"),
        ("error", "a rule, watcher or loop raised; data: where, type, message"),
        ("effect", "an action described as data, for an executor; key: effect id"),
        ("effect-executing", "an executor claimed an effect; data: attempt, lease_until, "
                             "owner, pid, started"),
        ("effect-acked", "an effect finished; data: attempt, result, duration_ms"),
        ("effect-failed", "an effect attempt failed; data: attempt, error, retry_at or final"),
        ("mark", "a fact a rule recorded about its own state (a counter, a backoff, a "
                 "once-only marker); key: mark:<tag>; data: mark"),
        ("payload-purged", "a content-addressed payload was deleted; key: its digest"),
        ("engine-started", "an engine opened this home; data: pid, owner"),
        ("engine-stopped", "an engine closed this home cleanly; data: pid, interrupted"),
        ("promote", "staged business rules were promoted; data: revision"),
        ("rollback", "business rules were rolled back; data: revision, reason"),
    ]
)
