"""The awareness reviewer (seed 000): a gated, fingerprinted, budgeted LLM review of memory.

The AwarenessRule (fast, in the tick) decides who is due and whether the world changed; the
AwarenessExecutor (off the tick) asks the model, gates its proposals and settles atomically.
"""

from pulse_adapters.awareness.config import AwarenessConfig, AwarenessConfigError, EvidenceCaps
from pulse_adapters.awareness.contract import Envelope, InvalidEnvelope, parse_envelope
from pulse_adapters.awareness.effects import AwarenessReview
from pulse_adapters.awareness.evidence import Evidence, build_evidence
from pulse_adapters.awareness.executor import AwarenessExecutor, Foreground
from pulse_adapters.awareness.fingerprint import fingerprint, shape
from pulse_adapters.awareness.gate import GateResult, Rejection, Verb, gate
from pulse_adapters.awareness.ledger import AwarenessLedger, CycleRecord, LedgerData, ReviewState
from pulse_adapters.awareness.quiet import QuietState, QuietStore
from pulse_adapters.awareness.rule import AwarenessRule, due_at, route_healthy

__all__ = [
    "AwarenessConfig",
    "AwarenessConfigError",
    "AwarenessExecutor",
    "AwarenessLedger",
    "AwarenessReview",
    "AwarenessRule",
    "CycleRecord",
    "Envelope",
    "Evidence",
    "EvidenceCaps",
    "Foreground",
    "GateResult",
    "InvalidEnvelope",
    "LedgerData",
    "QuietState",
    "QuietStore",
    "Rejection",
    "ReviewState",
    "Verb",
    "build_evidence",
    "due_at",
    "fingerprint",
    "gate",
    "parse_envelope",
    "route_healthy",
    "shape",
]
