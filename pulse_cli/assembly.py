"""The one place an engine is assembled from a home: config.json's layers and settings, and an
engine directory's layer, built for the home the engine runs on.

The daemon, `upulse tick`, `upulse dev` and the promote gate's dry run all build their engine
with `build_engine`, so what the gate accepts is what the daemon will run. Engine code gets
its home from the engine it is built for (LayerContext.home), never from where its files lie:
under `upulse dev`, `upulse tick` and the gate's dry run that is a scratch copy.

Two config.json files may set `default_tick_ms`: the engine directory's, when it sets it,
wins (it is staged, gated and rolled back with the rules that rely on it); otherwise the
home's applies.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pulse_cli.config import Config, ConfigError, home_host
from pulse_cli.loader import EngineCode, load_engine_code
from pulse_core import (
    Clock,
    Engine,
    EngineDirectory,
    Layer,
    LayerContext,
    LayerError,
    SystemClock,
    load_layers,
    placement,
)

NO_CODE = EngineCode(exported=Layer("engine"), revision=None)
"""What an engine runs when it has no engine directory code: an empty business layer."""


class BrokenLayer(ConfigError):
    """A layer config.json names is not installed, fails to import, or refuses its settings."""


def load_code(code_dir: Path, *, staged: bool = False,
              revision: str | None = None) -> EngineCode:
    """The business code in `code_dir`; none without the folder.

    Production (HOME/engine) runs commits: in a git work tree the code is HEAD's, and edits
    not committed there do not run (EngineCode.uncommitted names them). `staged` loads the
    files as they are on disk instead: HOME/staging under the gate, `upulse dev` and
    `upulse tick --staging`. `revision` loads that commit's files (`upulse replay`).
    Raises EngineCodeError when the code does not load. Blocking (it imports the code).
    """
    if not code_dir.is_dir():
        return NO_CODE
    return load_engine_code(code_dir, committed=not staged, revision=revision)


def uncommitted_note(code_dir: Path, code: EngineCode) -> str:
    """The line that says which edits in `code_dir` do not run (see EngineCode.uncommitted)."""
    shown = ", ".join(code.uncommitted[:5]) + (", …" if len(code.uncommitted) > 5 else "")
    return (f"{code_dir} has {len(code.uncommitted)} uncommitted change(s) that do not run "
            f"({shown}); revision {code.revision} runs — edit in staging and promote, or "
            f"`git -C {code_dir} stash` them")


def configured_layers(root: Path, cfg: Config, *, clock: Clock,
                      directory: EngineDirectory | None = None) -> list[Layer]:
    """The layers config.json names, built with their settings, in order.

    Raises BrokenLayer (a ConfigError naming the file's field and the layer) when one is
    missing, broken, or refuses its settings.
    """
    try:
        return load_layers(cfg.layers, LayerContext(root, clock, directory))
    except LayerError as exc:
        raise BrokenLayer(f"{root / 'config.json'}: layers: {exc}") from exc


def default_tick_ms(cfg: Config, code: EngineCode) -> int:
    """The engine's default tick: the engine directory's config.json's, else the home's."""
    tick = code.settings.get("default_tick_ms", cfg.default_tick_ms)
    assert isinstance(tick, int)  # the loader checked it
    return tick


def tick_source(code: EngineCode, home: Path) -> Path:
    """Which config.json the default tick comes from, for the daemon's log."""
    if "default_tick_ms" in code.settings:
        return code.entry.parent / "config.json"
    return home / "config.json"


def bound_host(root: Path, cfg: Config) -> str:
    """The host the engine of the home `root` with settings `cfg` is bound to, as the
    engine's `placement`: the home's host name (pulse_cli.config.home_host) when its store
    is shared across hosts (PostgreSQL), '' when the log is the home's alone. Promote and
    rollback record their events under it (pulse_cli.directory_log.event_key)."""
    return home_host(root, cfg) if placement(cfg.store, cfg.host) else ""


def build_engine(root: Path, cfg: Config, code: EngineCode, *,
                 directory: EngineDirectory | None = None, clock: Clock | None = None,
                 rule_timeout: float | None = None,
                 drain_timeout: float | None = None) -> Engine:
    """An engine on the home `root`: the survival layer with `cfg.survival`, the layers of
    `cfg.layers`, and `code`'s layer, built for `root`, as the business layer, over
    `cfg.store`; its default tick is `code`'s default_tick_ms if set, else `cfg`'s.

    Raises BrokenLayer for a configured layer, EngineCodeError when `code`'s layer cannot be
    built, and the Engine's own errors (UnhandledEffect, SurvivalLocked, RuleChainError,
    LayerError for the survival layer) for the rest.
    `rule_timeout` and `drain_timeout` override the engine's and config's defaults (the
    promote gate bounds its dry run with them).
    """
    clock = clock or SystemClock()
    options: dict[str, Any] = {}
    if rule_timeout is not None:
        options["rule_timeout"] = rule_timeout
    layers = configured_layers(root, cfg, clock=clock, directory=directory)
    engine = Engine(
        root,
        layers=layers,
        business=code.build(LayerContext(root, clock, directory)),
        store=cfg.store,
        side_store=cfg.side_store,
        host=bound_host(root, cfg) or cfg.host,  # on a log of its own, claims name the machine
        clock=clock,
        survival=cfg.survival,
        engine_directory=directory,
        default_tick_ms=default_tick_ms(cfg, code),
        drain_timeout=cfg.daemon.drain_timeout_s if drain_timeout is None else drain_timeout,
        **options,
    )
    engine.ticker.revision = code.revision  # kept in each tick record
    return engine
