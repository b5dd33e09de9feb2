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
from pulse_survival.control import (
    ProcessRequestRefused,
    UnknownProcess,
    check_request,
    request_draft,
    request_process,
)
from pulse_survival.effects import (
    SURVIVAL_TAGS,
    ArchiveSessions,
    Cleanup,
    Notify,
    RestartProcess,
    Rollback,
    StopProcess,
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
    PendingRequest,
    ProcessRecord,
    SurvivalLedger,
    SurvivalLedgerData,
)
from pulse_survival.logtail import NoProcessLog, follow, log_of, output_log, tail
from pulse_survival.marks import (
    SURVIVAL_MARKS,
    ErrorsEscalated,
    GaveUp,
    LlmRestartScheduled,
    LlmRouteHealthy,
    NetworkOutageAnnounced,
    NetworkRecoveryAnnounced,
    Recovered,
    RequestHandled,
    StartFailed,
    StartHeld,
    StreakCounted,
)
from pulse_survival.page import ProcessTally, survival_metrics, survival_page
from pulse_survival.requests import ACTIONS, PROCESS_REQUESTED, Action, ProcessRequest
from pulse_survival.supervised import (
    ALIVE_KEY,
    ProcessState,
    SupervisedState,
    judged_states,
    process_states,
    supervised_states,
    watchdog_in,
)
from pulse_survival.watchers import find_process
from pulse_survival.webhooks import WebhookSecretInvalid, new_webhook_secret, sign_webhook

__all__ = [
    "ACTIONS",
    "ALIVE_KEY",
    "PROCESS_REQUESTED",
    "RULE_ORDER",
    "SURVIVAL_MARKS",
    "SURVIVAL_TAGS",
    "Action",
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
    "NoProcessLog",
    "Notify",
    "NotifySinks",
    "PendingRequest",
    "ProcessPolicy",
    "ProcessRecord",
    "ProcessRequest",
    "ProcessRequestRefused",
    "ProcessState",
    "ProcessTally",
    "Recovered",
    "RequestHandled",
    "ResourceThresholds",
    "RestartProcess",
    "Rollback",
    "RollbackPolicy",
    "StartFailed",
    "StartHeld",
    "StopProcess",
    "StreakCounted",
    "SupervisedState",
    "SurvivalConfig",
    "SurvivalConfigError",
    "SurvivalLedger",
    "SurvivalLedgerData",
    "UnknownProcess",
    "WebhookFailed",
    "WebhookSecretInvalid",
    "check_request",
    "find_process",
    "follow",
    "judged_states",
    "load_config",
    "log_of",
    "new_webhook_secret",
    "output_log",
    "process_states",
    "request_draft",
    "request_process",
    "sign_webhook",
    "supervised_states",
    "survival_config",
    "survival_layer",
    "survival_metrics",
    "survival_page",
    "tail",
    "unknown_field",
    "watchdog_in",
]

publish_face(__name__)
