"""pulse_survival: the P0 layer every Engine runs outermost: 4 watchers, 7 rules, executors.

Zero LLM and zero network in its decisions; only the network watcher probes the network. The
engine finds it through the `pulse.survival` entry point, `pulse_survival.layer:layer`.
"""

from pulse_core import (
    Essential,  # the same struct, kept here for existing imports
    publish_face,
)
from pulse_survival.config import (
    ErrorLogPolicy,
    LlmPolicy,
    NetworkTargets,
    NotifySinks,
    ProcessPolicy,
    ResourceThresholds,
    RollbackPolicy,
    SurvivalConfig,
    SurvivalConfigError,
    load_config,
    unknown_field,
)
from pulse_survival.effects import (
    SURVIVAL_TAGS,
    ArchiveSessions,
    Cleanup,
    Notify,
    RestartProcess,
    Rollback,
)
from pulse_survival.executors import (
    EngineDirectory,
    FolderRefused,
    NoEngineDirectory,
    WebhookFailed,
)
from pulse_survival.layer import RULE_ORDER, survival_config, survival_layer
from pulse_survival.ledger import (
    ErrorNotice,
    LlmRecord,
    ProcessRecord,
    SurvivalLedger,
    SurvivalLedgerData,
)
from pulse_survival.marks import (
    SURVIVAL_MARKS,
    ErrorsEscalated,
    GaveUp,
    LlmRestartScheduled,
    LlmRouteHealthy,
    NetworkOutageAnnounced,
    NetworkRecoveryAnnounced,
    Recovered,
    StartFailed,
    StartHeld,
    StreakCounted,
)
from pulse_survival.page import ProcessTally, survival_metrics, survival_page
from pulse_survival.supervised import (
    ProcessState,
    SupervisedState,
    process_states,
    supervised_states,
)
from pulse_survival.webhooks import WebhookSecretInvalid, new_webhook_secret, sign_webhook

__all__ = [
    "RULE_ORDER",
    "SURVIVAL_MARKS",
    "SURVIVAL_TAGS",
    "ArchiveSessions",
    "Cleanup",
    "EngineDirectory",
    "ErrorLogPolicy",
    "ErrorNotice",
    "ErrorsEscalated",
    "Essential",
    "FolderRefused",
    "GaveUp",
    "LlmPolicy",
    "LlmRecord",
    "LlmRestartScheduled",
    "LlmRouteHealthy",
    "NetworkOutageAnnounced",
    "NetworkRecoveryAnnounced",
    "NetworkTargets",
    "NoEngineDirectory",
    "Notify",
    "NotifySinks",
    "ProcessPolicy",
    "ProcessRecord",
    "ProcessState",
    "ProcessTally",
    "Recovered",
    "ResourceThresholds",
    "RestartProcess",
    "Rollback",
    "RollbackPolicy",
    "StartFailed",
    "StartHeld",
    "StreakCounted",
    "SupervisedState",
    "SurvivalConfig",
    "SurvivalConfigError",
    "SurvivalLedger",
    "SurvivalLedgerData",
    "WebhookFailed",
    "WebhookSecretInvalid",
    "load_config",
    "new_webhook_secret",
    "process_states",
    "sign_webhook",
    "supervised_states",
    "survival_config",
    "survival_layer",
    "survival_metrics",
    "survival_page",
    "unknown_field",
]

publish_face(__name__)
