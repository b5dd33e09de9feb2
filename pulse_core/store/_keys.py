"""keys.db: one AES-256-GCM key per memory element, kept outside the append-only log.

A memory element's text is sealed with its own key before it is appended (EventStore.append
seals the fields each kind declares with `seal_fields`), so the log, the checkpoints folded
from it and every backup of either hold ciphertext only. Purging an element destroys its key:
the row is deleted with `secure_delete` on and the write-ahead log checkpointed and truncated,
so the key's bytes leave the file, and every copy of the ciphertext (the log, its backups, a
copy of the token in another record) stays unreadable for good. What remains of the element
is a tombstone (its id and when), which lets a reader say "purged" instead of "missing".

Sealing is deterministic for one element and one value (the nonce is an HMAC of the value,
as in SIV): an idempotent append repeated with the same text stores the same bytes. A sealed
value is a str, `SEALED_PREFIX` + base64(nonce + ciphertext) + ":" + element id, so it fits
any text field and names the element whose key opens it; the element id is the associated
data, so a token moved to another element does not open.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import os
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import msgspec

from pulse_core._errors import ElementTextUnreadable, StoreReadOnly, StoreUnavailable
from pulse_core._events import EventDraft
from pulse_core._homelock import open_private
from pulse_core.store._sqlite import (
    APPLICATION_ID,
    ReadOnlyConnection,
    check_identity,
    sqlite_errors,
)

SEALED_PREFIX = "\x1epulse-sealed:v1:"
"""How every sealed value begins (a record separator first: never typed by a person)."""
SEALED_BYTES = b"\x1epulse-sealed:v1\n"
"""How every sealed attachment begins."""
PURGED_TEXT = "[purged]"
"""What a reader shows in place of text whose element was purged."""

_NONCE = 12
_KEY = 32
_VERSION = 1
_PURPOSE = "element keys store"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS element_keys (
    element    TEXT PRIMARY KEY,
    key        BLOB NOT NULL,
    created_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS destroyed_keys (
    element      TEXT PRIMARY KEY,
    destroyed_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE VIRTUAL TABLE IF NOT EXISTS element_text USING fts5(
    element UNINDEXED, text, tokenize = 'unicode61 remove_diacritics 2'
);
CREATE TABLE IF NOT EXISTS element_text_rows (
    element TEXT PRIMARY KEY,
    row     INTEGER NOT NULL
) WITHOUT ROWID;
"""
_WORD = re.compile(r"\w+")
_FROM_URLSAFE = bytes.maketrans(b"-_", b"+/")  # base64.urlsafe_b64decode's, in one call
_FOUND = "SELECT element FROM element_text WHERE element_text MATCH ?"
# a few found elements' keys are joined as they are found (LIMIT: a common word is not
# joined to all its elements' keys, and costs the FTS5 prefix lookup once more)
_FOUND_KEYED = ("SELECT t.element, k.key FROM element_text t LEFT JOIN element_keys k "
                "ON k.element = t.element WHERE element_text MATCH ?1 LIMIT ?2")


class Found(NamedTuple):
    """What a text search of the element index found: the elements, and the keys of those
    that have one when the search read them (None: not read)."""

    elements: set[str]
    keys: dict[str, bytes] | None


def text_words(text: str) -> list[str]:
    """The lower-case words of `text`, as recall's text search splits it."""
    return _WORD.findall(text.lower())


def _indexed_text(kind: str, data: Mapping[str, Any]) -> str | None:
    """The plain text of a draft that the element's text index holds (None: leave the
    element's row as it is): its sealed fields, a state item's name before its value."""
    if kind == "state-revised" and not data.get("value_changed"):
        return None
    parts = [str(data.get("record", ""))] if kind in ("state-set", "state-revised") else []
    for name in sealed_fields(kind):
        if name == "reason":
            continue
        value = data.get(name)
        parts.append(value if isinstance(value, str) else msgspec.json.encode(value).decode())
    return " ".join(parts)

_sealed: dict[str, tuple[str, ...]] = {}


def seal_fields(kind: str, *fields: str) -> None:
    """Declare that the data fields `fields` of events of `kind` (keyed `identity:<id>`,
    with a `record`) are element text, sealed with the element's key when appended."""
    _sealed[kind] = tuple(dict.fromkeys((*_sealed.get(kind, ()), *fields)))


def sealed_fields(kind: str) -> tuple[str, ...]:
    """The data fields of `kind` that are sealed (empty for most kinds)."""
    return _sealed.get(kind, ())


def is_sealed(value: object) -> bool:
    """Whether `value` is a sealed token (legacy plaintext is not)."""
    return isinstance(value, str) and value.startswith(SEALED_PREFIX)


def sealed_element(token: str) -> str:
    """The element id a sealed token names."""
    at = token.find(":", len(SEALED_PREFIX))
    return "" if at < 0 else token[at + 1:]


def draft_element(kind: str, key: str, data: object) -> str | None:
    """The element id ("<identity>/<record>") an event of `kind` on `key` writes, when its
    kind seals text and it names a record; None otherwise."""
    if kind not in _sealed or not key.startswith("identity:") or not isinstance(data, dict):
        return None
    record = data.get("record")
    if not isinstance(record, str) or not record:
        return None
    return f"{key.removeprefix('identity:')}/{record}"


@functools.cache
def _cipher() -> tuple[Any, type[Exception]]:
    """AES-GCM and the error a changed text or key raises (loaded when first used)."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    return AESGCM, InvalidTag


def _aead(key: bytes) -> Any:
    return _cipher()[0](key[:_KEY])


def _nonce(key: bytes, element: bytes, plain: bytes) -> bytes:
    return hmac.new(key[_KEY:], element + b"\0" + plain, hashlib.sha256).digest()[:_NONCE]


def seal_with(key: bytes, element: str, plain: bytes) -> bytes:
    """nonce + AES-256-GCM ciphertext of `plain` under `key`, bound to `element`."""
    aad = element.encode()
    nonce = _nonce(key, aad, plain)
    return nonce + bytes(_aead(key).encrypt(nonce, plain, aad))


def open_with(key: bytes, element: str, sealed: bytes) -> bytes:
    """The plaintext of `seal_with`'s output; ElementTextUnreadable when the key does not fit
    or the bytes were changed."""
    aesgcm, invalid = _cipher()
    try:
        return bytes(aesgcm(key[:_KEY]).decrypt(sealed[:_NONCE], sealed[_NONCE:],
                                                element.encode()))
    except (invalid, ValueError):
        raise ElementTextUnreadable(element, (
            f"the text of element {element!r} does not open with its key: the key or the "
            "sealed bytes were changed — restore keys.db from the keys file written with "
            "`upulse backup --keys`")) from None


def _unindex(db: sqlite3.Connection, element: str) -> bool:
    """Delete `element`'s row of the text index (found by its rowid); whether it had one."""
    found = db.execute("SELECT row FROM element_text_rows WHERE element = ?",
                       (element,)).fetchone()
    if found is None:
        return False
    db.execute("DELETE FROM element_text WHERE rowid = ?", (found[0],))
    db.execute("DELETE FROM element_text_rows WHERE element = ?", (element,))
    return True


class ElementKeys:
    """The keys of a home's elements in one SQLite file (keys.db; see the module docstring).

    Thread-safe; every call is one short statement (no cache, so a key destroyed by another
    process is gone here at the next read). Read-only, nothing is created: a missing file
    reads as no keys.
    """

    def __init__(self, path: str | Path, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._lock = threading.Lock()
        self._db: sqlite3.Connection | None = None
        self._reader: ReadOnlyConnection | None = None
        if read_only:
            return
        os.close(open_private(self.path, os.O_RDWR))
        try:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"{self.path}: cannot open the element keys: {exc}") from exc
        try:
            check_identity(db, self.path, schema_version=_VERSION, purpose=_PURPOSE)
            with sqlite_errors(self.path):
                db.execute("PRAGMA secure_delete=ON")
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=FULL")  # a key is durable before its text
                db.execute("PRAGMA busy_timeout=5000")
                db.executescript(_SCHEMA)
                db.execute(f"PRAGMA application_id={APPLICATION_ID}")
                db.execute(f"PRAGMA user_version={_VERSION}")
        except BaseException:
            db.close()
            raise
        self._db = db

    def _run(self, work: Callable[[sqlite3.Connection], Any]) -> Any:
        with self._lock:
            if self.read_only:  # nothing written, not even a -shm (ReadOnlyConnection)
                if self._reader is None:
                    if not self.path.exists():
                        return None  # no keys (yet): every sealed text reads as missing
                    self._reader = ReadOnlyConnection(self.path, schema_version=_VERSION,
                                                      purpose=_PURPOSE)
                return self._reader.read(work) if self._reader.ready else None
            if self._db is None:
                return None
            try:
                return work(self._db)
            except sqlite3.Error as exc:
                raise StoreUnavailable(f"{self.path}: element keys: {exc}") from exc

    def key(self, element: str) -> bytes | None:
        """`element`'s key, or None when it has none (never made, destroyed, or lost)."""
        row = self._run(lambda db: db.execute(
            "SELECT key FROM element_keys WHERE element = ?", (element,)).fetchone())
        return None if row is None else bytes(row[0])

    def keys_of(self, elements: Iterable[str]) -> dict[str, bytes]:
        """The keys of those of `elements` that have one, read in one statement (none is
        made): what opens many texts at once reads them so."""
        wanted = sorted(set(elements))
        if not wanted:
            return {}
        rows = self._run(lambda db: db.execute(
            "SELECT element, key FROM element_keys WHERE element IN "
            f"({','.join('?' * len(wanted))})", wanted).fetchall())
        return {element: bytes(key) for element, key in rows or ()}

    def destroyed(self, element: str) -> bool:
        """Whether `element`'s key was destroyed by a purge."""
        return bool(self._run(lambda db: db.execute(
            "SELECT 1 FROM destroyed_keys WHERE element = ?", (element,)).fetchone()))

    def keys_for(self, elements: Iterable[str]) -> dict[str, bytes]:
        """The keys of `elements`, those missing made now, in one durable transaction (an
        element whose key a purge destroyed is given a throwaway key, kept nowhere)."""
        wanted = sorted(set(elements))
        if self.read_only:
            raise StoreReadOnly(f"{self.path}: opened read-only, so no key can be made for "
                                f"{wanted[0]!r} — open the home without read_only")
        now = int(time.time() * 1000)

        def make(db: sqlite3.Connection) -> dict[str, bytes]:
            with db:
                db.execute("BEGIN IMMEDIATE")
                db.executemany("INSERT OR IGNORE INTO element_keys SELECT ?, ?, ? WHERE NOT "
                               "EXISTS (SELECT 1 FROM destroyed_keys WHERE element = ?1)",
                               [(e, os.urandom(_KEY * 2), now) for e in wanted])
                found = {e: bytes(row[0]) for e in wanted for row in db.execute(
                    "SELECT key FROM element_keys WHERE element = ?", (e,))}
            # a purged element gets a key that is never kept: what it is given is unreadable
            return {e: found.get(e) or os.urandom(_KEY * 2) for e in wanted}
        found: dict[str, bytes] = self._run(make)
        return found

    def seal(self, element: str, value: Any, key: bytes | None = None) -> str:
        """`value` (any JSON value) sealed with `element`'s key (`key`, or read or made
        now); a value already sealed for `element` is returned as it is."""
        if is_sealed(value) and sealed_element(value) == element:
            return str(value)
        key = key or self.keys_for([element])[element]
        sealed = seal_with(key, element, msgspec.json.encode(value))
        return f"{SEALED_PREFIX}{base64.urlsafe_b64encode(sealed).decode()}:{element}"

    def seal_bytes(self, element: str, data: bytes, key: bytes | None = None) -> bytes:
        """An attachment sealed with `element`'s key."""
        key = key or self.keys_for([element])[element]
        return SEALED_BYTES + seal_with(key, element, data)

    def _opening_key(self, element: str) -> bytes:
        key = self.key(element)
        if key is not None:
            return key
        if self.destroyed(element):
            raise ElementTextUnreadable(element, (
                f"the text of element {element!r} was purged: its key was destroyed"),
                purged=True)
        raise ElementTextUnreadable(element, (
            f"no key for element {element!r} in {self.path}: keys.db is missing or was "
            "replaced — restore it from the keys file written with `upulse backup --keys`"))

    def open(self, token: str, key: bytes | None = None) -> Any:
        """The value a sealed token holds (`key`: its element's key, when already read);
        ElementTextUnreadable naming the element when it was purged, its key is missing, or
        the key or the token were changed."""
        body, _, element = token[len(SEALED_PREFIX):].partition(":")
        key = key or self._opening_key(element)
        try:
            sealed = binascii.a2b_base64(body.encode("ascii").translate(_FROM_URLSAFE))
        except ValueError:
            raise ElementTextUnreadable(element, (
                f"the sealed text of element {element!r} is damaged (not base64)")) from None
        plain = open_with(key, element, sealed)
        try:
            return msgspec.json.decode(plain)
        except msgspec.DecodeError:
            raise ElementTextUnreadable(element, (
                f"the sealed text of element {element!r} is not JSON")) from None

    def open_bytes(self, element: str, data: bytes) -> bytes:
        """An attachment's plain bytes (legacy plain bytes are returned as they are)."""
        if not data.startswith(SEALED_BYTES):
            return data
        return open_with(self._opening_key(element), element, data[len(SEALED_BYTES):])

    def destroy(self, element: str) -> bool:
        """Destroy `element`'s key for good and leave a tombstone; the key's bytes are
        overwritten in the file and the write-ahead log is emptied. False when it had none."""
        if self.read_only:
            raise StoreReadOnly(f"{self.path}: opened read-only, so the key of {element!r} "
                                "cannot be destroyed — open the home without read_only")

        def destroy(db: sqlite3.Connection) -> bool:
            with db:
                db.execute("BEGIN IMMEDIATE")
                gone = db.execute("DELETE FROM element_keys WHERE element = ?",
                                  (element,)).rowcount
                db.execute("INSERT OR IGNORE INTO destroyed_keys VALUES (?, ?)",
                           (element, int(time.time() * 1000)))
                if _unindex(db, element):  # merge the segments: no deleted word stays
                    db.execute("INSERT INTO element_text (element_text) VALUES ('optimize')")
            busy = db.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
            if busy:
                raise StoreUnavailable(
                    f"{self.path}: the key of {element!r} is deleted, but a reader kept the "
                    "write-ahead log from being emptied — run the purge's finish again")
            return bool(gone)
        result: bool = self._run(destroy)
        return result

    def index(self, rows: Sequence[tuple[str, str]]) -> None:
        """Put each (element, plain text) into the text index, replacing the element's row
        (one transaction; beside the keys, never in the log)."""
        if not rows:
            return

        def put(db: sqlite3.Connection) -> None:
            with db:
                db.execute("BEGIN IMMEDIATE")
                for element, text in rows:
                    _unindex(db, element)
                    row = db.execute("INSERT INTO element_text (element, text) VALUES (?, ?)",
                                     (element, text)).lastrowid
                    db.execute("INSERT INTO element_text_rows VALUES (?, ?)", (element, row))
        self._run(put)

    def search(self, words: Sequence[str]) -> set[str] | None:
        """The elements whose indexed text holds a word starting with each of `words`
        (FTS5, all words); None when this file has no text index (an older keys.db opened
        read-only, or no keys.db)."""
        found = self.search_keyed(words, 0)
        return None if found is None else found.elements

    def search_keyed(self, words: Sequence[str], keys_up_to: int) -> Found | None:
        """As `search`, with the keys of the elements found (those that have one) read in
        the same statement when they are at most `keys_up_to`."""
        query = " ".join('"' + w.replace('"', '""') + '"*' for w in words)

        def find(db: sqlite3.Connection) -> Found | None:
            try:
                if keys_up_to > 0:
                    rows = db.execute(_FOUND_KEYED, (query, keys_up_to + 1)).fetchall()
                    if len(rows) <= keys_up_to:
                        return Found({row[0] for row in rows},
                                     {e: bytes(key) for e, key in rows if key is not None})
                return Found({row[0] for row in db.execute(_FOUND, (query,))}, None)
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return None
                raise
        found: Found | None = self._run(find)
        return found

    def export(self) -> dict[str, str]:
        """Every live key, base64, by element (what `upulse backup --keys` writes)."""
        rows = self._run(lambda db: db.execute(
            "SELECT element, key FROM element_keys ORDER BY element").fetchall()) or []
        return {element: base64.b64encode(key).decode() for element, key in rows}

    def load(self, keys: Mapping[str, str]) -> int:
        """Add the keys of an export (a key destroyed here since stays destroyed); returns
        how many were added."""
        rows = [(element, base64.b64decode(key), int(time.time() * 1000))
                for element, key in keys.items()]

        def load(db: sqlite3.Connection) -> int:
            with db:
                db.execute("BEGIN IMMEDIATE")
                before = db.total_changes
                db.executemany("INSERT OR IGNORE INTO element_keys SELECT ?, ?, ? WHERE NOT "
                               "EXISTS (SELECT 1 FROM destroyed_keys WHERE element = ?1)",
                               rows)
                return db.total_changes - before
        added: int = self._run(load) or 0
        return added

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            if self._db is not None:
                self._db.close()
                self._db = None
            if self._reader is not None:
                self._reader.close()
                self._reader = None


def seal_drafts(keys: ElementKeys, drafts: Sequence[EventDraft]) -> list[EventDraft]:
    """`drafts` with their element text (and attachments) sealed with their elements' keys,
    the keys made in one transaction; drafts of kinds that seal nothing as they are."""
    elements = [draft_element(d.kind, d.key, d.data) for d in drafts]
    found = keys.keys_for(e for e in elements if e is not None)
    out: list[EventDraft] = []
    indexed: dict[str, str] = {}
    for draft, element in zip(drafts, elements, strict=True):
        if element is None:
            out.append(draft)
            continue
        key = found[element]
        data = dict(draft.data)
        for name in sealed_fields(draft.kind):
            if name in data:
                data[name] = keys.seal(element, data[name], key)
        attachment = None if draft.attachment is None \
            else keys.seal_bytes(element, draft.attachment, key)
        out.append(msgspec.structs.replace(draft, data=data, attachment=attachment))
        text = _indexed_text(draft.kind, draft.data)
        if text is not None:
            indexed[element] = text
    keys.index(list(indexed.items()))
    return out


def reveal(value: Any, keys: ElementKeys | None, *, purged: str | None = PURGED_TEXT,
           known: Mapping[str, bytes] | None = None) -> Any:
    """`value` with every sealed token in it (nested in lists and dicts too) opened; plain
    values as they are. The text of a purged element reads as `purged` (raises with None);
    a missing or changed key raises ElementTextUnreadable naming the element. `known`: keys
    already read (`ElementKeys.keys_of`); an element's key missing there is read."""
    if isinstance(value, str):
        if not value.startswith(SEALED_PREFIX):
            return value
        if keys is None:
            element = sealed_element(value)
            raise ElementTextUnreadable(element, (
                f"the text of element {element!r} is sealed and this store has no keys — "
                "open it through its home (pulse_core.open_home)"))
        try:
            return keys.open(value, known.get(sealed_element(value)) if known else None)
        except ElementTextUnreadable as exc:
            if exc.purged and purged is not None:
                return purged
            raise
    if isinstance(value, dict):
        return {k: reveal(v, keys, purged=purged, known=known) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [reveal(v, keys, purged=purged, known=known) for v in value]
    return value
