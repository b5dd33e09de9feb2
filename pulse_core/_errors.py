"""Every error pulse raises on purpose, under one base.

::

    PulseError
    ├── StoreError                  a store cannot be opened or written
    │   ├── NotAPulseDatabase       the file is not SQLite, or SQLite of another program
    │   ├── SchemaTooNew            written by a newer pulse; upgrade to read it
    │   ├── StoreUnavailable        locked by another writer too long, disk full, I/O error,
    │   │   │                       a server that cannot be reached
    │   │   └── AppendOutcomeUnknown
    │   │                           a connection lost while an append committed: it may or
    │   │                           may not be stored
    │   ├── StoreClosed             used after close()
    │   ├── StoreReadOnly           a write to a store opened read-only
    │   ├── EventUnreadable         a stored event's data cannot be decoded
    │   ├── StoreBackendMissing     no backend installed for a store URL's scheme, or its
    │   │                           driver is missing
    │   └── EventLogLost            checkpoints remain but the event log is empty
    ├── HomeLocked                  another engine holds the home folder
    ├── SignalsUnavailable          run_forever() outside the main thread
    ├── HomePermissionDenied        this user may not create or write a file of the home
    ├── AppendRejected              an append was refused and nothing of it was written
    │   ├── VersionConflict         a key is not at the version the caller expected
    │   ├── IdempotencyConflict     an idempotency key was reused for other content
    │   ├── InvalidEvent            a draft is malformed (bad kind, key, or payload shape)
    │   │   ├── UnknownKind         the kind is not in the catalogue
    │   │   └── PayloadNotEncodable msgspec cannot encode the payload
    │   ├── PrincipalRefused        the handle's principal may not write that origin or
    │   │                           kind (pulse_core._principals)
    │   ├── RevisionRefused         an assertion may not supersede or close that claim
    │   └── MergeRefused            an identity merge that would form a cycle, or repeat
    ├── ObjectMissing               a content-addressed payload is absent or was purged
    ├── TickNotFound                no tick of that number ran on this home
    ├── TickNotRecorded             a tick that ran but kept no record (it wrote nothing)
    ├── ElementTextUnreadable       an element's sealed text does not open: purged, its key
    │                               missing, or key or text changed
    ├── RuleChainError              compose() got a non-callable, or inner was called twice
    ├── LayerError                  a layer is missing, broken, or refused its settings
    │   └── LayerOpenFailed         a layer's lifespan raised as the engine opened
    ├── UnhandledEffect             a rule can emit an effect type no executor handles
    ├── SurvivalLocked              user code tried to switch off or reorder a survival rule
    ├── UnknownEffect               an effect tag no Effect class declares
    ├── EffectNotFound              cancel or retry named an id no effect in the log has
    ├── EffectStateConflict         cancel or retry of an effect whose state does not allow it
    ├── InvalidTransition           a task event that its current status does not allow
    ├── NotAuthorized               a principal acted without the grant the action needs
    └── PurgeRefused                a purge that a legal hold, a reference or a missing
                                    confirmation forbids

Messages say what was wrong, where, and what to do.
"""

from __future__ import annotations

from collections.abc import Iterable


class PulseError(Exception):
    """Base of every error pulse raises on purpose."""


class StoreError(PulseError):
    """A store cannot be opened, read or written."""


class NotAPulseDatabase(StoreError):
    """The file is not a SQLite database, or belongs to another program, or is corrupted."""


class SchemaTooNew(StoreError):
    """The database was written by a newer pulse whose schema this version cannot read."""


class StoreUnavailable(StoreError):
    """The store refused the operation for now: SQLite locked too long, a full disk, a
    read-only file, an I/O error; a PostgreSQL or Redis server that cannot be reached or a
    connection that broke."""


class AppendOutcomeUnknown(StoreUnavailable):
    """The connection broke while an append was being committed and the store could not be
    asked whether it was: the append may or may not be stored. Append the same drafts again
    once the store answers (an `idem` on each makes that safe), never changed ones: a draft
    whose content changed under the same `idem` is refused, and one without an `idem` may be
    stored twice."""


class LockLost(StoreUnavailable):
    """An exclusive lock (`EventStore.exclusive`) was lost while held: the session holding it
    dropped, so another holder may be inside. Raised by each append made inside the block
    since, and by leaving it. It does not pass with time: leave the block and take the lock
    again; trying the same write inside the block never succeeds (`write_through_outage`
    stops trying at once)."""


class StoreClosed(StoreError):
    """The store was used after close()."""


class StoreReadOnly(StoreError):
    """A write to a store that was opened read-only."""


class StoreBackendMissing(StoreError):
    """No store backend is installed for a store URL's scheme, or the backend (or the driver
    it needs) cannot be imported."""


class EventUnreadable(StoreError):
    """A stored event's data cannot be decoded (a corrupt row) and it is not quarantined."""

    def __init__(self, seq: int, location: str, reason: str) -> None:
        self.seq = seq
        self.location = location
        self.reason = reason
        super().__init__(
            f"{location}: event #{seq} cannot be read ({reason}) — open the home for writing "
            "(the engine quarantines an unreadable row and reads on), or restore the log from "
            "a backup"
        )


class EventLogLost(StoreError):
    """The home keeps checkpoints of a log that is now empty: the log was lost or replaced."""


class HomeLocked(PulseError):
    """Another engine already holds the exclusive lock on this home folder."""


class SignalsUnavailable(PulseError):
    """`run_forever()` was called outside the main thread, where signals cannot be handled."""


class HomePermissionDenied(PulseError):
    """This user may not create, open or write a folder or file of a home (its owner or
    mode forbid it, or the home is on read-only storage)."""


class AppendRejected(PulseError):
    """An append was refused as a whole; nothing of it was written."""


class VersionConflict(AppendRejected):
    """A key is not at the version the caller expected."""

    def __init__(self, key: str, expected: int, actual: int) -> None:
        self.key = key
        self.expected = expected
        self.actual = actual
        super().__init__(
            f"{key!r} is at version {actual}, expected {expected} — re-read and retry"
        )


class IdempotencyConflict(AppendRejected):
    """An idempotency key was already used for different content."""

    def __init__(self, idem: str, stored_seq: int) -> None:
        self.idem = idem
        self.stored_seq = stored_seq
        super().__init__(
            f"idempotency key {idem!r} already names event #{stored_seq} with different "
            "content — use a new key for a new request"
        )


class InvalidEvent(AppendRejected):
    """A draft is malformed: its kind, key, origin or payload shape is wrong."""


class UnknownKind(InvalidEvent):
    """The kind is not in the catalogue."""

    def __init__(self, kind: str, known: Iterable[str]) -> None:
        self.kind = kind
        near = sorted(k for k in known if k.split("-")[0] == kind.split("-", maxsplit=1)[0])
        hint = f"; known kinds like it: {', '.join(near)}" if near else ""
        super().__init__(
            f"unknown event kind {kind!r}{hint} — register it with "
            "pulse_core.register_kind() before appending"
        )


class PayloadNotEncodable(InvalidEvent):
    """msgspec cannot encode the payload of a draft."""


class RevisionRefused(AppendRejected):
    """An assertion tried to supersede or close a claim it may not (another actor's, unknown,
    already superseded or closed); nothing was written."""

    def __init__(self, identity: str, record: str, message: str) -> None:
        self.identity = identity
        self.record = record
        super().__init__(message)


class MergeRefused(AppendRejected):
    """A merge that would form a cycle, merge an identity into itself, or merge a source that
    is already merged; nothing was written."""

    def __init__(self, source: str, into: str, message: str) -> None:
        self.source = source
        self.into = into
        super().__init__(message)


class ObjectMissing(PulseError):
    """A content-addressed payload is not in objects/ (never stored, or purged)."""


class TickNotFound(PulseError):
    """No tick of that number ran on this home (ticks are numbered from 1)."""


class TickNotRecorded(PulseError):
    """A tick that ran but kept no record: it wrote nothing (no effect, no event), ran before
    tick records were kept, or its record was purged."""


class ElementTextUnreadable(PulseError):
    """An element's sealed text cannot be opened: the element was purged (`purged`), its key
    is missing from keys.db, or the key or the sealed bytes were changed. `element` names it."""

    def __init__(self, element: str, message: str, *, purged: bool = False) -> None:
        self.element = element
        self.purged = purged
        super().__init__(message)


class RecallRefused(PulseError):
    """A recall query is malformed: `field` names the query field that was wrong (a limit
    below 1, an empty text or topic, no identity/topic/text at all) and the message what to
    give instead. Nothing is read or changed."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(message)


class UnknownIdentity(RecallRefused):
    """A recall named an identity the memory does not hold (never written about, or merged
    away). `identity` names it."""

    def __init__(self, identity: str) -> None:
        self.identity = identity
        super().__init__("identity", f"no memory of identity {identity!r}: check the id "
                         "(upulse memory list shows the known identities)")


class RuleChainError(PulseError):
    """The rule chain is malformed or was driven wrongly (inner called twice in one tick)."""


class LayerError(PulseError):
    """A layer is not installed, failed to import, or refused its settings."""


class LayerOpenFailed(LayerError):
    """A layer's lifespan raised as the engine opened: the engine did not open."""


class UnhandledEffect(PulseError):
    """A rule declares an effect type that no executor of the engine handles."""


class SurvivalLocked(PulseError):
    """User code tried to switch off, replace, add or reorder a survival rule."""


class UnknownEffect(PulseError):
    """An `effect` event names a tag that no Effect class in this process declares."""


class EffectNotFound(PulseError):
    """Cancel or retry named an effect id that no `effect` event in the log has."""

    def __init__(self, effect_id: str, message: str) -> None:
        self.effect_id = effect_id
        super().__init__(message)


class EffectStateConflict(PulseError):
    """Cancel or retry of an effect whose state does not allow it (cancel: pending or
    retrying; retry: failed for good or cancelled); `status` is the state it is in."""

    def __init__(self, effect_id: str, status: str, message: str) -> None:
        self.effect_id = effect_id
        self.status = status
        super().__init__(message)


class InvalidTransition(PulseError):
    """A task lifecycle event that the task's current status does not allow."""


class NotAuthorized(PulseError):
    """A principal tried an action its grants do not allow (`principal`, `permission`)."""

    def __init__(self, principal: str, permission: str, message: str) -> None:
        self.principal = principal
        self.permission = permission
        super().__init__(message)


class PurgeRefused(PulseError):
    """A purge was refused (legal hold, still referenced, not confirmed); nothing changed."""
