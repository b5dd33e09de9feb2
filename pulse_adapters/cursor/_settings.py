"""The cursor layer's settings: which `agent` program, which agents (each with its repository
folder), the model, the run timeout, extra arguments and the dispatch policy.

In config.json they are the object under `"layers": {"cursor": {...}}`; in Python a
`CursorSettings(...)`. The Cursor API key never appears in either: the CLI reads it from
CURSOR_API_KEY in the engine's environment.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec

from pulse_adapters.agents import AgentSpec, DispatchPolicy
from pulse_core import LayerError, layer_settings

LAYER = "cursor"
"""The layer's name, in config.json and in the `pulse.layers` entry-point group."""

FIELD = f"layers.{LAYER}"
"""Where the settings live in config.json, as errors name them."""

_OWN_FLAGS = ("-p", "--print", "--output-format", "--stream-partial-output")
_SECRET_FLAGS = ("--api-key",)


class CursorSettingsError(LayerError):
    """A setting of the cursor layer is missing or wrong; the message names the field
    (`layers.cursor.<field>`) and what to do."""


class CursorAgent(AgentSpec, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """One Cursor agent: an AgentSpec and the repository folder its runs work in (the
    process's working directory, which Cursor takes as its workspace)."""

    repo: str

    def __post_init__(self) -> None:
        super().__post_init__()
        folder = Path(self.repo).expanduser()
        if not folder.is_absolute():
            raise ValueError(f"`repo` of agent {self.name!r} must be an absolute path (got "
                             f"{self.repo!r})")
        if not folder.is_dir():
            what = "does not exist" if not folder.exists() else "is not a folder"
            raise ValueError(f"`repo` of agent {self.name!r} is {self.repo}, which {what} — "
                             "clone the repository there or fix the path")

    @property
    def folder(self) -> Path:
        """The repository folder, `~` expanded."""
        return Path(self.repo).expanduser()


class CursorSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the cursor layer runs coding tasks.

    `program` is the Cursor CLI (`agent` on PATH, or its path); `agents` the agents tasks go
    to; `model` is passed as `--model` (None: the CLI's default); `run_timeout_s` bounds one
    run; `extra_args` go before the prompt (e.g. `--force`, `--trust`); `policy` says when a
    failed or stuck task is requeued or given up.
    """

    agents: tuple[CursorAgent, ...]
    program: str = "agent"
    model: str | None = None
    run_timeout_s: float = 1800.0
    extra_args: tuple[str, ...] = ()
    policy: DispatchPolicy = msgspec.field(default_factory=DispatchPolicy)

    def __post_init__(self) -> None:
        if not self.program.strip():
            raise ValueError("`program` must name the Cursor CLI (`agent`) or its path")
        if not self.agents:
            raise ValueError("`agents` must list at least one agent, e.g. "
                             '[{"name": "coder", "repo": "/srv/repo"}]')
        names = [a.name for a in self.agents]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"`agents` names must be unique; repeated: {', '.join(repeated)}")
        if self.model is not None and not self.model.strip():
            raise ValueError("`model` must name a model (`agent --list-models`), or be null "
                             "for the CLI's default")
        if not self.run_timeout_s > 0:
            raise ValueError(f"`run_timeout_s` must be > 0 seconds (got {self.run_timeout_s})")
        if not math.isfinite(self.run_timeout_s):
            raise ValueError(f"`run_timeout_s` must be a finite number of seconds (got "
                             f"{self.run_timeout_s})")
        for arg in self.extra_args:
            flag = arg.split("=", 1)[0]
            if flag in _OWN_FLAGS:
                raise ValueError(f"`extra_args` may not hold {flag}: the layer sets -p and "
                                 "--output-format stream-json itself")
            if flag in _SECRET_FLAGS:
                raise ValueError(f"`extra_args` may not hold {flag}: a key on the command "
                                 "line is visible to every process — export CURSOR_API_KEY "
                                 "where the engine runs instead")

    def agent(self, name: str) -> CursorAgent | None:
        """The agent called `name` (None when there is none)."""
        return next((a for a in self.agents if a.name == name), None)


def load_settings(settings: Any) -> CursorSettings:
    """`settings` as CursorSettings: one already, or config.json's object for the layer.

    Raises CursorSettingsError naming the field that is missing, unknown or wrong.
    """
    if isinstance(settings, CursorSettings):
        return settings
    if settings is None:
        raise CursorSettingsError(
            f"layer {LAYER!r} needs settings: at least `agents`, e.g. "
            '{"agents": [{"name": "coder", "repo": "/srv/repo"}]} under ' + FIELD)
    return layer_settings(settings, CursorSettings, CursorSettingsError, LAYER)
