"""The public surface is deliberate: this test pins it, and every name in it is documented."""

from __future__ import annotations

import inspect

import pulse_core
import pulse_core.store

EXPECTED_CORE = {
    "AgentCapabilityStats", "AgentStats", "AppendRejected", "AppendResult", "Backoff",
    "CapabilityData", "Clock", "Decision", "Effect", "EffectEntry", "EffectOutcome",
    "EffectStatus", "Engine", "EngineDirectory", "Event", "EventDraft", "EventStore",
    "ExecutionContext", "Executor", "ExecutorLoop", "HomeLayout", "HomeLocked", "HomeStores",
    "IdempotencyConflict", "IdentityMemory", "Inner", "InvalidEvent", "InvalidTransition",
    "KindSpec", "Layer", "LayerContext", "LayerError", "LayerFactory", "LoopState", "LoopStatus",
    "ManualClock", "Mark", "Memory", "MemoryBoard", "NotAPulseDatabase", "ObjectMissing",
    "ObjectStore", "Page", "PayloadNotEncodable", "PendingTasks", "PendingTasksData",
    "PersistentMap", "Projection", "Projector", "PulseError", "RecentErrors", "Recorder",
    "Retention", "Rule", "RuleChain", "RuleChainError", "RuleTrace", "Sample", "SchemaTooNew",
    "Service", "SideStore", "Snapshot", "SqliteEventStore", "SqliteRecorder", "SqliteSideStore",
    "SqliteVitalsStore", "StoreClosed", "StoreError", "StoreReadOnly", "StoreUnavailable",
    "Supervisor", "SurvivalLocked", "SystemClock", "TaskBoard", "TaskState", "Tasks",
    "UnhandledEffect", "UnknownEffect", "UnknownKind", "VersionConflict", "VitalReading",
    "VitalsStore", "Watcher", "adaptive_interval", "available_layers", "clamp_tick", "compose",
    "decode_effect", "decode_mark", "dedup", "default_builtin_rules", "effect_type", "emits",
    "error_backoff", "error_draft", "fold_effect", "guarded", "identity_key", "known_kinds",
    "load_layer", "load_layers", "open_home", "parse_store_url", "purge_payload", "register_kind",
    "wait_signal",
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
