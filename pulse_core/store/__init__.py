"""The stores: the event log (an EventStore over one backend's Recorder), vitals, side state,
and objects/ (payloads). Homes open them together through `pulse_core.open_home`."""

from pulse_core._faces import publish_face
from pulse_core.store._base import EventStore
from pulse_core.store._events import SqliteEventStore, SqliteRecorder
from pulse_core.store._objects import ObjectStore, digest_of, purge_payload
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
from pulse_core.store._side import SideStore, SqliteSideStore, open_side_store
from pulse_core.store._url import (
    PostgresURL,
    SqliteURL,
    StoreURL,
    open_event_store,
    parse_store_url,
)
from pulse_core.store._vitals import (
    Retention,
    Sample,
    SqliteVitalsStore,
    TickVitals,
    VitalsStore,
)

__all__ = [
    "AppendResult",
    "EventStore",
    "ObjectStore",
    "Page",
    "PostgresURL",
    "PreparedAppend",
    "PreparedDraft",
    "Recorder",
    "RedisSideStore",
    "Retention",
    "Sample",
    "SideStore",
    "SqliteEventStore",
    "SqliteRecorder",
    "SqliteSideStore",
    "SqliteURL",
    "SqliteVitalsStore",
    "StoreURL",
    "StoredRow",
    "TickVitals",
    "UnreadableEvent",
    "VitalsStore",
    "digest_of",
    "open_event_store",
    "open_side_store",
    "parse_store_url",
    "purge_payload",
]

publish_face(__name__)
