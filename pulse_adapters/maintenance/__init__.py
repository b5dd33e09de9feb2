"""Memory maintenance (seed 004): the deterministic metabolism cycle as a layer.

The MaintenanceRule (fast, in the tick) decides when a cycle is due: on a schedule, on demand,
after a long session, on a sleep-task backlog, or when a watch fired; the MaintenanceExecutor
(off the tick) runs the cycle, an activity whose report counts what it did. Consolidation goes
through a proposer and a deterministic gate; skills move only by recorded verdicts.
`layer(settings, context)` builds the `maintenance` layer that config.json switches on.
"""

from pulse_adapters.maintenance._assessment import Assessment, assess
from pulse_adapters.maintenance._consolidation import (
    ConsolidationBatch,
    ConsolidationReport,
    InvalidProposals,
    Proposer,
    consolidate,
    gate_insights,
)
from pulse_adapters.maintenance._cycle import CycleFailed, run_cycle
from pulse_adapters.maintenance._executor import MaintenanceExecutor
from pulse_adapters.maintenance._imports import ImportFlagged, ImportReviews
from pulse_adapters.maintenance._layer import layer
from pulse_adapters.maintenance._ledger import (
    CycleBegan,
    CycleRequested,
    LedgerState,
    MaintenanceLedger,
    request_cycle,
)
from pulse_adapters.maintenance._page import MaintenanceCycles, cycle_history, maintenance_page
from pulse_adapters.maintenance._proposer import LlmProposer
from pulse_adapters.maintenance._report import NOTHING_TO_DO, CycleReport, HealthSignal
from pulse_adapters.maintenance._rule import MaintenanceCycle, MaintenanceRule
from pulse_adapters.maintenance._self_model import (
    SELF_MODEL,
    SelfModel,
    SelfModelEntry,
    self_model_summary,
)
from pulse_adapters.maintenance._self_model import render as render_self_model
from pulse_adapters.maintenance._settings import (
    Budgets,
    ConsolidationSettings,
    DecaySettings,
    ImportSettings,
    MaintenanceSettings,
    MaintenanceSettingsError,
    RetentionSettings,
    ScheduleSettings,
    SelfModelSettings,
    Triggers,
    load_settings,
)
from pulse_adapters.maintenance._skills import (
    OutcomeObserved,
    Skill,
    SkillBoard,
    SkillProposed,
    SkillVerdict,
    VerdictPolicy,
    verdict,
)
from pulse_adapters.maintenance._working_state import (
    WORKING_STATE,
    OpenCommitment,
    WorkingState,
    session_primer,
)
from pulse_adapters.maintenance._working_state import render as render_working_state
from pulse_core import publish_face
from pulse_core.maintenance import ImportVerified, verify_import  # the gate lives in the core

__all__ = [
    "NOTHING_TO_DO",
    "SELF_MODEL",
    "WORKING_STATE",
    "Assessment",
    "Budgets",
    "ConsolidationBatch",
    "ConsolidationReport",
    "ConsolidationSettings",
    "CycleBegan",
    "CycleFailed",
    "CycleReport",
    "CycleRequested",
    "DecaySettings",
    "HealthSignal",
    "ImportFlagged",
    "ImportReviews",
    "ImportSettings",
    "ImportVerified",
    "InvalidProposals",
    "LedgerState",
    "LlmProposer",
    "MaintenanceCycle",
    "MaintenanceCycles",
    "MaintenanceExecutor",
    "MaintenanceLedger",
    "MaintenanceRule",
    "MaintenanceSettings",
    "MaintenanceSettingsError",
    "OpenCommitment",
    "OutcomeObserved",
    "Proposer",
    "RetentionSettings",
    "ScheduleSettings",
    "SelfModel",
    "SelfModelEntry",
    "SelfModelSettings",
    "Skill",
    "SkillBoard",
    "SkillProposed",
    "SkillVerdict",
    "Triggers",
    "VerdictPolicy",
    "WorkingState",
    "assess",
    "consolidate",
    "cycle_history",
    "gate_insights",
    "layer",
    "load_settings",
    "maintenance_page",
    "render_self_model",
    "render_working_state",
    "request_cycle",
    "run_cycle",
    "self_model_summary",
    "session_primer",
    "verdict",
    "verify_import",
]

publish_face(__name__)
