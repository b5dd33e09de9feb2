"""The openclaw layer's settings: config.json's `layers.openclaw` object, validated."""

from __future__ import annotations

import math
import os
import re
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import msgspec

from pulse_adapters.llm import ModelEndpoint
from pulse_core import LayerError, layer_settings

LAYER = "openclaw"
"""The layer's name, in config.json and in the `pulse.layers` entry-point group."""

MIN_VERSION = "2026.9.6"
"""The oldest OpenClaw this layer was tested with."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
BOOTSTRAP_NAMES = frozenset({"AGENTS.md", "SOUL.md", "IDENTITY.md", "USER.md", "BOOTSTRAP.md",
                             "MEMORY.md"})
"""The file names OpenClaw's bootstrap-extra-files hook loads (2026.9.6)."""


class OpenClawSettingsError(LayerError):
    """A setting of the openclaw layer is wrong; the message names `layers.openclaw.<field>`."""


def _bad(field: str, problem: str) -> OpenClawSettingsError:
    return OpenClawSettingsError(f"layers.{LAYER}.{field} {problem}")


def _positive(struct: msgspec.Struct, where: str, *names: str, unit: str = " seconds") -> None:
    for name in names:
        value = getattr(struct, name)
        if not (value > 0 and math.isfinite(value)):
            raise _bad(f"{where}{name}", f"must be a finite number > 0{unit} (got {value!r})")


class GatewaySettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The gateway process: where it listens, how pulse starts it again, how it is probed.

    `keep_alive` declares it an essential process (the survival layer restarts it with
    `openclaw gateway run --port <port> <args...>`); `pidfile` (default
    `<home>/run/openclaw-gateway.pid`) is where a restart writes its pid; `match_cmdline` or
    `match_name` find a gateway started some other way (OpenClaw names its process
    `openclaw-gateway`).
    """

    port: int = 18789
    args: tuple[str, ...] = ()
    keep_alive: bool = True
    pidfile: str | None = None
    match_name: str | None = None
    match_cmdline: str | None = None
    log: str | None = None
    interval_s: float = 5.0
    timeout_s: float = 3.0

    def __post_init__(self) -> None:
        if not 0 < self.port < 65536:
            raise _bad("gateway.port", f"must be a TCP port 1-65535 (got {self.port})")
        _positive(self, "gateway.", "interval_s", "timeout_s")


class ModelSettings(ModelEndpoint, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The model route the gateway uses (a ModelEndpoint), probed every `route_ttl_s` into
    vitals `route_key` when `probe` is on. Unset `base_url`/`model` are read from OpenClaw's
    own config (`agents.*.model` and `models.providers`) at the first probe; `api_key_env`
    NAMES the variable holding the provider's key (OpenClaw's CLI never shows it)."""

    probe: bool = True
    renamed_fields: ClassVar[dict[str, str]] = {"vitals_key": "`route_key`",
                                                "interval_s": "`route_ttl_s`"}

    def __post_init__(self) -> None:
        problem = self.endpoint_problem(required=False)
        if problem is not None:
            raise _bad(f"model.{problem[0]}", problem[1])


class NoticeSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Which effects become notices in the agent's session (`session_key`, default
    `agent:<agent>:main`), how long one gateway call may take, the retry backoff, how often
    the gateway is asked whether a queued notice was consumed (`poll_s`), how many notices
    may wait in the gateway's queue at once (`max_queued`), and whether a notice is also
    written into the transcript for a human to see in the UI (`show_in_ui`)."""

    enabled: bool = True
    effects: tuple[str, ...] = ("notify",)
    session_key: str | None = None
    timeout_s: float = 30.0
    retry_initial_s: float = 2.0
    retry_max_s: float = 120.0
    poll_s: float = 30.0
    show_in_ui: bool = False
    max_queued: int = 10

    def __post_init__(self) -> None:
        _positive(self, "notices.", "timeout_s", "retry_initial_s", "retry_max_s", "poll_s")
        if not 1 <= self.max_queued <= 19:
            raise _bad("notices.max_queued", f"({self.max_queued}) must be 1 to 19: the "
                                             "gateway keeps 20 system events per session")
        if self.retry_max_s < self.retry_initial_s:
            raise _bad("notices.retry_max_s", f"({self.retry_max_s:g}) must be >= "
                                              f"retry_initial_s ({self.retry_initial_s:g})")


class TranscriptSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True,
                         kw_only=True):
    """Transcript ingest: every user and assistant message of the agent's sessions becomes a
    human exchange of memory identity `identity`, read every `interval_s`, `batch` rows a
    read. A new user message seen in a session holds the foreground (reviews sharing the
    model route wait) until the agent's answer is seen, at most `foreground_lapse_s` (0:
    never held)."""

    enabled: bool = True
    identity: str = "owner"
    interval_s: float = 2.0
    batch: int = 500
    foreground_lapse_s: float = 600.0

    def __post_init__(self) -> None:
        if not self.identity.strip():
            raise _bad("transcripts.identity", "must name the memory identity the agent's "
                                               "conversations are about, e.g. \"owner\"")
        _positive(self, "transcripts.", "interval_s")
        _positive(self, "transcripts.", "batch", unit=" rows")


class PrimerSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """The session primer as a workspace bootstrap file: when `enabled`, pulse keeps the
    primer (at most `max_chars`) in `<workspace>/<path>`, which OpenClaw's
    `bootstrap-extra-files` hook puts into each session's context. `workspace` defaults to
    the agent's default workspace, `<state_dir>/workspace`; `path` must end in one of the
    basenames the hook loads and stay inside the workspace."""

    enabled: bool = False
    workspace: str | None = None
    path: str = "pulse/MEMORY.md"
    max_chars: int = 1200

    def __post_init__(self) -> None:
        parts = PurePosixPath(self.path).parts
        if PurePosixPath(self.path).is_absolute() or ".." in parts or not parts:
            raise _bad("primer.path", f"must be a path inside the workspace (got {self.path!r})")
        if parts[-1] not in BOOTSTRAP_NAMES:
            raise _bad("primer.path", f"must end in a name OpenClaw's bootstrap-extra-files "
                                      f"hook loads: {', '.join(sorted(BOOTSTRAP_NAMES))} "
                                      f"(got {parts[-1]!r})")
        if not 80 <= self.max_chars <= 20_000:
            raise _bad("primer.max_chars", f"must be 80 to 20000 characters (got "
                                           f"{self.max_chars}); OpenClaw injects at most "
                                           "20000 of a bootstrap file")


class OpenClawSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """`layers.openclaw`: the program, the environment every OpenClaw command runs with, its
    state folder (default `$OPENCLAW_STATE_DIR`, else `$HOME/.openclaw`, both read from `env`
    first), the agent id, and the parts' own settings."""

    program: str = "openclaw"
    env: dict[str, str] = {}
    state_dir: str | None = None
    agent: str = "main"
    cli_timeout_s: float = 60.0
    sessions_interval_s: float = 30.0
    gateway: GatewaySettings = msgspec.field(default_factory=GatewaySettings)
    model: ModelSettings = msgspec.field(default_factory=ModelSettings)
    notices: NoticeSettings = msgspec.field(default_factory=NoticeSettings)
    transcripts: TranscriptSettings = msgspec.field(default_factory=TranscriptSettings)
    primer: PrimerSettings = msgspec.field(default_factory=PrimerSettings)

    def __post_init__(self) -> None:
        if not self.program.strip():
            raise _bad("program", "must name the openclaw program or its path")
        if not re.match(r"^[a-z0-9][a-z0-9_-]*$", self.agent):
            raise _bad("agent", f"must be an OpenClaw agent id like \"main\" (got {self.agent!r})")
        _positive(self, "", "cli_timeout_s", "sessions_interval_s")
        for name, value in self.env.items():
            if not _ENV_NAME.fullmatch(name) or "\0" in value:
                raise _bad(f"env.{name}", "must be a variable NAME (letters, digits, _) with a "
                                          "value without NUL bytes")

    def resolved_state_dir(self) -> Path:
        """The OpenClaw state folder this layer reads."""
        if self.state_dir:
            return Path(self.state_dir).expanduser()
        given = self.env.get("OPENCLAW_STATE_DIR") or os.environ.get("OPENCLAW_STATE_DIR")
        if given:
            return Path(given).expanduser()
        home = self.env.get("HOME") or os.environ.get("HOME") or str(Path.home())
        return Path(home) / ".openclaw"

    def primer_file(self) -> Path:
        """Where the session primer is kept."""
        primer = self.primer
        workspace = (Path(primer.workspace).expanduser() if primer.workspace
                     else self.resolved_state_dir() / "workspace")
        return workspace / primer.path

    def notice_session(self) -> str:
        """The session key notices go into."""
        return self.notices.session_key or f"agent:{self.agent}:main"


def load_settings(settings: Any) -> OpenClawSettings:
    """`settings` as OpenClawSettings: one already, None (every default), or config.json's
    object; OpenClawSettingsError names the field that is unknown or wrong."""
    return layer_settings(settings, OpenClawSettings, OpenClawSettingsError, LAYER)
