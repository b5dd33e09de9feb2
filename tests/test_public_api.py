"""The public surface is deliberate: this test pins it, and every name in it is documented."""

from __future__ import annotations

import inspect

import pulse_core
import pulse_core.store

EXPECTED_CORE = {
    "AgentCapabilityStats", "AgentStats", "AppendOutcomeUnknown", "AppendRejected",
    "AppendResult", "Backoff",
    "CapabilityData", "Clock", "Decision", "Effect", "EffectEntry", "EffectNotFound",
    "EffectOutcome", "EffectStateConflict", "EffectStatus", "Engine", "EngineDirectory",
    "Essential", "Event", "EventDraft", "EventLogLost",
    "EventStore", "EventUnreadable",
    "ExecutionContext", "Executor", "ExecutorLoop", "HomeLayout", "HomeLocked", "HomeStores",
    "HomePermissionDenied",
    "IdempotencyConflict", "IdentityMemory", "IdentityRecords", "IdentitySummary", "Inner",
    "Instruments",
    "InvalidEvent", "InvalidTransition",
    "KindSpec", "Layer", "LayerContext", "LayerError", "LayerFactory", "LayerMetric",
    "LayerOpenFailed",
    "Lifespan", "LoopState", "LoopStatus",
    "LockLost", "ManualClock", "Mark", "Memory", "MemoryBoard", "MergeRefused", "NotAPulseDatabase",
    "NotAuthorized", "PurgeRefused", "ElementTextUnreadable", "RevisionRefused",
    "ObjectMissing", "ObjectStore", "Page", "PageAction", "PageRequest", "PageView",
    "PayloadNotEncodable", "PendingTasks",
    "PendingTasksData",
    "PersistentMap", "Principal", "PrincipalRefused", "Projection", "Projector", "PulseError",
    "Quote", "RecentErrors", "Recorder",
    "Retention", "Rollback", "Rule", "RuleChain", "RuleChainError", "RuleTrace", "Sample",
    "SchemaTooNew",
    "Service", "SideStore", "SignalsUnavailable", "Snapshot", "SqliteEventStore",
    "SqliteRecorder", "SqliteSideStore",
    "SqliteVitalsStore", "StoreBackendMissing", "StoreClosed", "StoreError", "StoreReadOnly",
    "StoreUnavailable",
    "Supervisor", "SurvivalLocked", "SystemClock", "TaskBoard", "TaskState", "Tasks", "UiPage",
    "UnhandledEffect", "UnknownEffect", "UnknownKind", "UnreadableEvent", "VersionConflict",
    "VitalReading",
    "VitalsStore", "Watcher", "adaptive_interval", "available_layers", "builtin_projections",
    "cancel_effect",
    "clamp_tick", "compose",
    "decode_effect", "decode_mark", "dedup", "default_builtin_rules", "effect_draft",
    "effect_type", "emits",
    "error_backoff", "error_draft", "fold_effect", "guarded", "host_of", "human_origin",
    "identity_key",
    "known_kinds", "layer_settings",
    "load_layer", "load_layers", "load_survival_layer", "open_home", "parse_store_url",
    "process_age_s",
    "process_started",
    "read_identities", "read_identity", "redact_urls", "register_kind",
    "retry_effect",
    "settings_problem",
    "started_on_wall_clock",
    "still_running",
    "summarise_identities",
    "wait_ended",
    "wait_signal",
    # what the CLI and the layers use of the kernel: kinds, ids, text and host checks, the
    # home's private files, rule names
    "EFFECT_KINDS", "MARK_KIND", "MAX_HOST_LENGTH", "MAX_KEY_LENGTH", "OUTAGE_BACKOFF",
    "PRIVATE_FILE",
    "QUARANTINED",
    "SURVIVAL_GROUP", "TASK_KINDS", "check_host", "check_text", "declared_effects", "denied",
    "loose_home", "next_task_state", "open_private", "placement", "private_folder",
    "rule_name", "stored_next", "uuid7", "write_private", "write_through_outage",
    # what `upulse migrate` uses: the home lock, the unfinished effects of a log
    "EffectIndex", "lock_home",
    # public names report their face as their module (the faces call it)
    "publish_face",
    # why an event is in the log, and the engines sharing a log (the UI's and CLI's views)
    "Causes", "causes_of", "event_at", "EngineHeartbeat", "EngineInstance", "FleetFold",
    "HeldLease", "LoopBeat", "fleet_json", "installed_version", "read_fleet",
    # the vitals key model-route probes write and llm_watchdog reads
    "LLM_ROUTE_KEY",
    # tick records: finding one, running it again, comparing what it decided
    "EffectDiff", "LogFold", "RecordedEffect", "RecordedTick", "Replayed", "TickNotFound",
    "TickNotRecorded", "TickRecord", "diff_effects", "find_tick", "last_recorded",
    "replay_tick",
}


def test_pulse_core_exports_exactly_its_public_names() -> None:
    assert set(pulse_core.__all__) == EXPECTED_CORE
    for name in pulse_core.__all__:
        assert hasattr(pulse_core, name), name


def test_every_public_class_and_function_has_a_docstring() -> None:
    import pulse_core.maintenance

    for module in (pulse_core, pulse_core.store, pulse_core.maintenance):
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


def test_implementation_modules_are_private() -> None:
    from pathlib import Path

    root = Path(pulse_core.__file__).parent
    public = {"__init__.py", "demo.py", "memory.py", "maintenance.py", "store/__init__.py"}
    exposed = sorted(str(p.relative_to(root)) for p in root.rglob("*.py")
                     if str(p.relative_to(root)) not in public and not p.name.startswith("_"))
    assert exposed == [], "name implementation modules with a leading underscore"


def test_the_store_and_memory_namespaces_list_their_public_names() -> None:
    import pulse_core.maintenance
    import pulse_core.memory

    for module in (pulse_core.store, pulse_core.memory, pulse_core.maintenance):
        assert module.__all__, module.__name__
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"
