"""The three stores: events.db (the log), vitals.db (samples), objects/ (payloads)."""

from pulse_core.store.base import AppendResult, EventStore
from pulse_core.store.events import SqliteEventStore
from pulse_core.store.objects import ObjectStore, digest_of, purge_payload
from pulse_core.store.vitals import Retention, Sample, VitalsStore

__all__ = [
    "AppendResult",
    "EventStore",
    "ObjectStore",
    "Retention",
    "Sample",
    "SqliteEventStore",
    "VitalsStore",
    "digest_of",
    "purge_payload",
]
