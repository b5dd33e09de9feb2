"""The stores: the event log (an EventStore over one backend's Recorder), vitals, side state,
and objects/ (payloads). Homes open them together through `pulse_core.open_home`.

A store URL's scheme names its backend; backends register themselves through entry points
(groups `pulse.stores` and `pulse.side_stores`), pulse's own like any other's.
"""

from pulse_core._faces import publish_face
from pulse_core.store._backends import (
    LogLocation,
    SideLocation,
    open_event_store,
    open_side_store,
    parse_side_store_url,
    parse_store_url,
    side_store_schemes,
    store_schemes,
)
from pulse_core.store._base import EventStore
from pulse_core.store._copy import copy_log, copy_sqlite_file
from pulse_core.store._keys import (
    PURGED_TEXT,
    ElementKeys,
    is_sealed,
    reveal,
    seal_fields,
    sealed_element,
    text_words,
)
from pulse_core.store._objects import ObjectStore, digest_of
from pulse_core.store._recorder import (
    AppendResult,
    Page,
    PreparedAppend,
    PreparedDraft,
    Recorder,
    StoredRow,
    UnreadableEvent,
)
from pulse_core.store._redis import RedisSideStore
from pulse_core.store._side import SideStore, SqliteSideStore
from pulse_core.store._sqlite_recorder import SqliteRecorder
from pulse_core.store._sqlite_store import SqliteEventStore
from pulse_core.store._url import PostgresURL, SqliteURL
from pulse_core.store._vitals import (
    Retention,
    Sample,
    SqliteVitalsStore,
    TickVitals,
    VitalsStore,
)

__all__ = [
    "PURGED_TEXT",
    "AppendResult",
    "ElementKeys",
    "EventStore",
    "LogLocation",
    "ObjectStore",
    "Page",
    "PostgresURL",
    "PreparedAppend",
    "PreparedDraft",
    "Recorder",
    "RedisSideStore",
    "Retention",
    "Sample",
    "SideLocation",
    "SideStore",
    "SqliteEventStore",
    "SqliteRecorder",
    "SqliteSideStore",
    "SqliteURL",
    "SqliteVitalsStore",
    "StoredRow",
    "TickVitals",
    "UnreadableEvent",
    "VitalsStore",
    "copy_log",
    "copy_sqlite_file",
    "digest_of",
    "is_sealed",
    "open_event_store",
    "open_side_store",
    "parse_side_store_url",
    "parse_store_url",
    "reveal",
    "seal_fields",
    "sealed_element",
    "side_store_schemes",
    "store_schemes",
    "text_words",
]

publish_face(__name__)
