"""The OpenClaw adapter: pulse around an OpenClaw gateway and its agent.

Watchers sense the gateway (HTTP /health and /readyz), its model route (into the `llm-route`
vitals llm_watchdog reads) and its session store; the gateway is an essential process the
survival layer restarts; chosen effects become notices the agent's model reads on its next
turn, once each; the agent's transcripts become memory exchanges the awareness reviewer reviews;
pulse's session primer is kept in a workspace bootstrap file.
"""

from pulse_adapters.openclaw._cli import OpenClawCli, OpenClawCommandFailed
from pulse_adapters.openclaw._ingest import TranscriptIngest, message_of
from pulse_adapters.openclaw._kinds import (
    NOTICE_DELIVERED,
    NOTICE_FAILED,
    NOTICE_QUEUED,
    TRANSCRIPT_MALFORMED,
    TRANSCRIPT_READ,
    NoticeDelivered,
    NoticeFailed,
    NoticeQueued,
    TranscriptMalformed,
    TranscriptRead,
    notice_key,
    notice_label,
    transcript_key,
)
from pulse_adapters.openclaw._layer import (
    GATEWAY,
    OpenClaw,
    build_openclaw,
    gateway_essential,
    layer,
)
from pulse_adapters.openclaw._notices import NoticeDelivery, notice_text
from pulse_adapters.openclaw._primer import PRIMER_WRITTEN, PrimerFile, PrimerWritten
from pulse_adapters.openclaw._settings import (
    LAYER,
    MIN_VERSION,
    GatewaySettings,
    ModelSettings,
    NoticeSettings,
    OpenClawSettings,
    OpenClawSettingsError,
    PrimerSettings,
    TranscriptSettings,
    load_settings,
)
from pulse_adapters.openclaw._store import AgentStore, TranscriptRow
from pulse_adapters.openclaw._watchers import (
    GatewayHealthWatcher,
    ModelRouteWatcher,
    RouteUnknown,
    SessionStoreWatcher,
)
from pulse_core import publish_face

__all__ = [
    "GATEWAY",
    "LAYER",
    "MIN_VERSION",
    "NOTICE_DELIVERED",
    "NOTICE_FAILED",
    "NOTICE_QUEUED",
    "PRIMER_WRITTEN",
    "TRANSCRIPT_MALFORMED",
    "TRANSCRIPT_READ",
    "AgentStore",
    "GatewayHealthWatcher",
    "GatewaySettings",
    "ModelRouteWatcher",
    "ModelSettings",
    "NoticeDelivered",
    "NoticeDelivery",
    "NoticeFailed",
    "NoticeQueued",
    "NoticeSettings",
    "OpenClaw",
    "OpenClawCli",
    "OpenClawCommandFailed",
    "OpenClawSettings",
    "OpenClawSettingsError",
    "PrimerFile",
    "PrimerSettings",
    "PrimerWritten",
    "RouteUnknown",
    "SessionStoreWatcher",
    "TranscriptIngest",
    "TranscriptMalformed",
    "TranscriptRead",
    "TranscriptRow",
    "TranscriptSettings",
    "build_openclaw",
    "gateway_essential",
    "layer",
    "load_settings",
    "message_of",
    "notice_key",
    "notice_label",
    "notice_text",
    "transcript_key",
]

publish_face(__name__)
