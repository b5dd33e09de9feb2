"""The awareness reviewer (seed 000): a gated, fingerprinted, budgeted LLM review of memory.

The AwarenessRule (fast, in the tick) decides who is due and whether the world changed; the
AwarenessExecutor (off the tick) asks the model, gates its proposals and settles atomically.
`layer(settings, context)` builds them all, with the route probe, the ledger and the
quiet-hold service, as the `awareness` layer.
"""

from pulse_adapters.awareness.config import AwarenessConfig, AwarenessConfigError, EvidenceCaps
from pulse_adapters.awareness.contract import (
    Envelope,
    InvalidEnvelope,
    decode_reply,
    parse_envelope,
)
from pulse_adapters.awareness.effects import AwarenessReview
from pulse_adapters.awareness.evidence import Evidence, build_evidence
from pulse_adapters.awareness.executor import AwarenessExecutor
from pulse_adapters.awareness.fingerprint import fingerprint, shape
from pulse_adapters.awareness.foreground import (
    Foreground,
    ForegroundBegan,
    ForegroundEnded,
    ForegroundFollower,
    NoAwarenessLayer,
    foreground_began,
    foreground_ended,
    foreground_of,
)
from pulse_adapters.awareness.gate import GateResult, Rejection, Verb, gate, show_proposal
from pulse_adapters.awareness.ledger import AwarenessLedger, CycleRecord, LedgerData, ReviewState
from pulse_adapters.awareness.page import ReviewerRecords, reviewer_page
from pulse_adapters.awareness.quiet import QuietHold, QuietHoldUnavailable, QuietState
from pulse_adapters.awareness.reviewer import (
    QuietHoldKeeper,
    Reviewer,
    ReviewRouteWatcher,
    build_reviewer,
    layer,
)
from pulse_adapters.awareness.rule import AwarenessRule, due_at, route_healthy
from pulse_adapters.awareness.settings import (
    AwarenessSettings,
    AwarenessSettingsError,
    load_settings,
)
from pulse_adapters.awareness.undo import (
    CycleNotFound,
    NothingToUndo,
    UndoConflict,
    UndoRefused,
    undo_cycle,
)
from pulse_core import publish_face

__all__ = [
    "AwarenessConfig",
    "AwarenessConfigError",
    "AwarenessExecutor",
    "AwarenessLedger",
    "AwarenessReview",
    "AwarenessRule",
    "AwarenessSettings",
    "AwarenessSettingsError",
    "CycleNotFound",
    "CycleRecord",
    "Envelope",
    "Evidence",
    "EvidenceCaps",
    "Foreground",
    "ForegroundBegan",
    "ForegroundEnded",
    "ForegroundFollower",
    "GateResult",
    "InvalidEnvelope",
    "LedgerData",
    "NoAwarenessLayer",
    "NothingToUndo",
    "QuietHold",
    "QuietHoldKeeper",
    "QuietHoldUnavailable",
    "QuietState",
    "Rejection",
    "ReviewRouteWatcher",
    "ReviewState",
    "Reviewer",
    "ReviewerRecords",
    "UndoConflict",
    "UndoRefused",
    "Verb",
    "build_evidence",
    "build_reviewer",
    "decode_reply",
    "due_at",
    "fingerprint",
    "foreground_began",
    "foreground_ended",
    "foreground_of",
    "gate",
    "layer",
    "load_settings",
    "parse_envelope",
    "reviewer_page",
    "route_healthy",
    "shape",
    "show_proposal",
    "undo_cycle",
]

publish_face(__name__)
