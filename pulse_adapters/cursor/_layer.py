"""The cursor layer: Cursor's CLI as a coding agent that takes tasks from the task board."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pulse_adapters.agents import Program, ProgramCheck, TaskDispatcher, agent_runs_page
from pulse_adapters.cursor._executor import CursorExecutor, CursorRun
from pulse_adapters.cursor._settings import FIELD, LAYER, CursorSettings, load_settings
from pulse_core import Layer, LayerContext

MIN_VERSION = "2025.10.22"
"""The oldest Cursor CLI whose stream-json output is on record (docs/cursor.md)."""

INSTALL_HINT = "install the Cursor CLI (curl https://cursor.com/install -fsS | bash)"


@dataclass(frozen=True)
class CursorLayer:
    """The layer's parts, and `layer`, the Layer that runs them together."""

    settings: CursorSettings
    program: ProgramCheck
    dispatcher: TaskDispatcher
    executor: CursorExecutor
    layer: Layer


def build_cursor(settings: Any, context: LayerContext) -> CursorLayer:
    """Build the layer's parts from `settings` (CursorSettings, or config.json's object);
    CursorSettingsError names a missing or wrong setting. The program is checked at engine
    start, not here: a missing `agent` is an error event, and the engine runs on."""
    valid = load_settings(settings)
    program = ProgramCheck(Program(field=f"{FIELD}.program", argv0=valid.program,
                                   min_version=MIN_VERSION, install_hint=INSTALL_HINT),
                           name=f"{LAYER}-program")
    dispatcher = TaskDispatcher(CursorRun, valid.agents, valid.policy, program=program)
    executor = CursorExecutor(valid, program)
    bundle = Layer(LAYER, rules=(dispatcher,), executors=(executor,), services=(program,),
                   ui=(agent_runs_page(LAYER, "Cursor", CursorRun, valid.agents),))
    return CursorLayer(valid, program, dispatcher, executor, bundle)


def layer(settings: Any, context: LayerContext) -> Layer:
    """The cursor layer (entry point `cursor` in group `pulse.layers`): the dispatcher of
    coding tasks to the configured agents, the executor that runs each as `agent -p`, and
    the check of the program at engine start."""
    return build_cursor(settings, context).layer
