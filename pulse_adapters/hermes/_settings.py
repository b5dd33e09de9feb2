"""The hermes layer's settings: which `hermes` program and Hermes home, the model route, the
agents tasks go to, the run timeout, transcript ingest and the dispatch policy.

In config.json they are the object under `"layers": {"hermes": {...}}`; in Python a
`HermesSettings(...)`. The model's API key never appears in either: `model.api_key_env`
names the environment variable that holds it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import msgspec

from pulse_adapters.agents import AgentSpec, DispatchPolicy
from pulse_adapters.llm import ModelEndpoint
from pulse_core import LayerError, layer_settings

LAYER = "hermes"
"""The layer's name, in config.json and in the `pulse.layers` entry-point group."""

FIELD = f"layers.{LAYER}"
"""Where the settings live in config.json, as errors name them."""

MIN_VERSION = "0.19.0"
"""The oldest hermes-agent the layer and the plugin are tested with."""

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_OWN_FLAGS = ("-z", "-m", "--oneshot", "--usage-file", "--provider", "--model")


class HermesSettingsError(LayerError):
    """A setting of the hermes layer is missing or wrong; the message names the field
    (`layers.hermes.<field>`) and what to do."""


class HermesModel(ModelEndpoint, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The model route Hermes' runs use (a ModelEndpoint plus Hermes' `provider`), given to
    each run through Hermes' environment (HERMES_INFERENCE_PROVIDER, HERMES_INFERENCE_MODEL,
    and for `custom` CUSTOM_BASE_URL and OPENAI_API_KEY), never written into Hermes'
    config.yaml. With `base_url`, the route is probed into the `route_key` vitals."""

    provider: str | None = None
    # Hermes' own config.yaml calls the model `model.default`
    renamed_fields: ClassVar[dict[str, str]] = {"default": "`model`"}

    def __post_init__(self) -> None:
        problem = self.endpoint_problem(required=False)
        if problem is not None:
            raise ValueError(f"`{problem[0]}` {problem[1]}")
        if self.base_url is not None and not self.model:
            raise ValueError("`model` must name the model `base_url` serves")

    def run_env(self, environ: Mapping[str, str] | None = None) -> dict[str, str]:
        """What a run's environment gets so Hermes uses this route."""
        env: dict[str, str] = {}
        if self.provider:
            env["HERMES_INFERENCE_PROVIDER"] = self.provider
        if self.model:
            env["HERMES_INFERENCE_MODEL"] = self.model
        if self.base_url and (self.provider or "custom") == "custom":
            env["CUSTOM_BASE_URL"] = self.base_url
            key = self.api_key(environ)
            if key:
                env["OPENAI_API_KEY"] = key
        return env


class HermesSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the hermes layer watches Hermes and runs tasks on it.

    `program` is the `hermes` CLI (on PATH, or its path); `home` its HERMES_HOME (None: the
    engine's HERMES_HOME, else ~/.hermes); `agents` the agents tasks go to (none: the layer
    only watches); `toolsets` is passed as `-t` (None: Hermes' configured ones);
    `run_timeout_s` bounds one run; `extra_args` go after the prompt; `workdir` is where runs
    start (Hermes reads AGENTS.md there); `gateway` keeps `hermes gateway run` alive as an
    essential process; `ingest` follows Hermes' session store into memory every
    `ingest_interval_s`; `identity` is whom exchanges of sessions without a platform user are
    remembered about; `home_interval_s` is how often Hermes' home is read; `lazy_installs`
    lets a run pip-install Hermes' optional packages into its environment (off, the default:
    HERMES_DISABLE_LAZY_INSTALLS=1).
    """

    program: str = "hermes"
    home: str | None = None
    model: HermesModel = msgspec.field(default_factory=HermesModel)
    agents: tuple[AgentSpec, ...] = ()
    toolsets: str | None = None
    run_timeout_s: float = 1800.0
    extra_args: tuple[str, ...] = ()
    workdir: str | None = None
    gateway: bool = False
    ingest: bool = True
    ingest_interval_s: float = 5.0
    identity: str = "owner"
    home_interval_s: float = 30.0
    lazy_installs: bool = False
    policy: DispatchPolicy = msgspec.field(default_factory=DispatchPolicy)

    def __post_init__(self) -> None:
        if not self.program.strip():
            raise ValueError("`program` must name the Hermes CLI (`hermes`) or its path")
        names = [a.name for a in self.agents]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ValueError(f"`agents` names must be unique; repeated: {', '.join(repeated)}")
        if not self.run_timeout_s > 0:
            raise ValueError(f"`run_timeout_s` must be > 0 seconds (got {self.run_timeout_s})")
        if not self.ingest_interval_s > 0:
            raise ValueError(f"`ingest_interval_s` must be > 0 seconds (got "
                             f"{self.ingest_interval_s})")
        if not self.home_interval_s > 0:
            raise ValueError(f"`home_interval_s` must be > 0 seconds (got "
                             f"{self.home_interval_s})")
        if not self.identity.strip():
            raise ValueError("`identity` must name whom unattributed exchanges are about")
        for arg in self.extra_args:
            if _own_flag(arg.split("=", 1)[0]):
                raise ValueError(f"`extra_args` may not hold {arg}: the layer passes the "
                                 "prompt with --oneshot, its usage report with --usage-file "
                                 "and the model through `model`")
        if self.workdir is not None and not Path(self.workdir).expanduser().is_dir():
            raise ValueError(f"`workdir` is {self.workdir}, which is not a folder")

    def hermes_env(self) -> dict[str, str]:
        """What the environment of every Hermes process the layer starts gets: HERMES_HOME
        (with `home`), and HERMES_DISABLE_LAZY_INSTALLS=1 unless `lazy_installs`."""
        env = {} if self.home is None else {"HERMES_HOME": str(self.hermes_home())}
        if not self.lazy_installs:
            env["HERMES_DISABLE_LAZY_INSTALLS"] = "1"
        return env

    def hermes_home(self, environ: Mapping[str, str] | None = None) -> Path:
        """The Hermes home runs and watchers use: `home`, else $HERMES_HOME, else ~/.hermes."""
        env = os.environ if environ is None else environ
        return Path(self.home or env.get("HERMES_HOME") or Path.home() / ".hermes").expanduser()


def _own_flag(name: str) -> bool:
    """Whether `name` is one of the flags the layer sets, or a long option Hermes' argparse
    would take as an abbreviation of one (`--usage=F`)."""
    if name in _OWN_FLAGS:
        return True
    return len(name) > 2 and name.startswith("--") and any(
        flag.startswith(name) for flag in _OWN_FLAGS)


def load_settings(settings: Any) -> HermesSettings:
    """`settings` as HermesSettings: one already, config.json's object for the layer, or None
    for the defaults (watch only). HermesSettingsError names the field that is wrong."""
    return layer_settings(settings, HermesSettings, HermesSettingsError, LAYER)
