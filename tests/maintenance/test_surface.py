"""The maintenance layer's public surface is deliberate: this test pins it, and every name in
it is documented."""

from __future__ import annotations

import inspect

import pulse_adapters.maintenance
import pulse_core.maintenance
from pulse_core import PulseError

EXPECTED = {
    "NOTHING_TO_DO", "Assessment", "Budgets", "ConsolidationBatch", "ConsolidationReport",
    "ConsolidationSettings", "CycleBegan", "CycleFailed", "CycleReport", "CycleRequested",
    "DecaySettings", "HealthSignal", "InvalidProposals", "LedgerState", "LlmProposer",
    "MaintenanceCycle", "MaintenanceCycles", "MaintenanceExecutor", "MaintenanceLedger",
    "MaintenanceRule", "MaintenanceSettings", "MaintenanceSettingsError", "OutcomeObserved",
    "Proposer", "RetentionSettings", "ScheduleSettings", "Skill", "SkillBoard", "SkillProposed",
    "SkillVerdict", "Triggers", "VerdictPolicy", "assess", "consolidate", "cycle_history",
    "gate_insights", "layer",
    "load_settings", "maintenance_page", "request_cycle", "run_cycle", "verdict",
    "WORKING_STATE", "WorkingState", "session_primer", "OpenCommitment", "render_working_state",
    "SELF_MODEL", "SelfModel", "SelfModelEntry", "SelfModelSettings", "render_self_model",
    "self_model_summary", "ImportFlagged", "ImportReviews", "ImportSettings", "ImportVerified",
    "verify_import",
}


def test_the_maintenance_layer_exports_exactly_its_public_names_each_documented() -> None:
    assert set(pulse_adapters.maintenance.__all__) == EXPECTED
    for module in (pulse_adapters.maintenance, pulse_core.maintenance):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) or inspect.isfunction(obj):
                assert inspect.getdoc(obj), f"{module.__name__}.{name}"
            if inspect.isclass(obj) and issubclass(obj, Exception):
                assert issubclass(obj, PulseError), f"{module.__name__}.{name}"
