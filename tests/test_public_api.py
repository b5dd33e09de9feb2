"""The public surface is deliberate: this test pins it, and every name in it is documented."""

from __future__ import annotations

import inspect

import pulse_core
import pulse_core.store

EXPECTED_CORE = {
    "AgentCapabilityStats", "AgentStats", "CapabilityData", "AppendRejected", "AppendResult",
    "Backoff", "Clock",
    "Decision", "Effect", "EffectOutcome", "Engine", "Event", "EventDraft", "EventStore",
    "ExecutionContext", "Executor", "ExecutorLoop", "HomeLocked", "IdempotencyConflict", "Inner",
    "InvalidEvent", "InvalidTransition", "IdentityMemory", "Memory", "MemoryBoard",
    "PersistentMap", "identity_key", "KindSpec", "ManualClock", "NotAPulseDatabase",
    "ObjectMissing", "ObjectStore", "PayloadNotEncodable", "PendingTasks", "PendingTasksData",
    "Projection", "Projector", "PulseError", "RecentErrors", "Retention", "Rule",
    "RuleChainError", "Sample", "SchemaTooNew", "Snapshot", "SqliteEventStore", "StoreClosed",
    "StoreError", "StoreUnavailable", "SurvivalLocked",
    "SystemClock", "TaskBoard", "TaskState", "Tasks",
    "UnknownEffect", "UnknownKind", "VersionConflict", "VitalReading", "VitalsStore", "Watcher",
    "adaptive_interval", "clamp_tick", "compose", "decode_effect", "dedup",
    "default_builtin_rules", "effect_type", "error_backoff", "guarded", "known_kinds",
    "purge_payload", "register_kind",
}


def test_pulse_core_exports_exactly_its_public_names() -> None:
    assert set(pulse_core.__all__) == EXPECTED_CORE
    for name in pulse_core.__all__:
        assert hasattr(pulse_core, name), name


def test_every_public_class_and_function_has_a_docstring() -> None:
    for module in (pulse_core, pulse_core.store):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                assert inspect.getdoc(obj), f"{module.__name__}.{name} has no docstring"


def test_every_error_derives_from_pulse_error() -> None:
    errors = [getattr(pulse_core, n) for n in pulse_core.__all__
              if inspect.isclass(getattr(pulse_core, n))
              and issubclass(getattr(pulse_core, n), Exception)]
    assert len(errors) >= 15
    assert all(issubclass(e, pulse_core.PulseError) for e in errors)
