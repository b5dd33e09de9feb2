"""pulse_cli: the `upulse` command — engine directories, promote and rollback, the daemon.

Its face gives what a program or a test drives `upulse` with: `main(argv)`, config.json's
parser, and the engine directory's building blocks (`init_engine_dir`, `revision`,
`load_code`, `build_engine`)."""

from pulse_cli.assembly import build_engine, load_code
from pulse_cli.config import ConfigError, parse_config
from pulse_cli.enginedir import init_engine_dir, revision
from pulse_cli.main import main

__all__ = [
    "ConfigError",
    "build_engine",
    "init_engine_dir",
    "load_code",
    "main",
    "parse_config",
    "revision",
]
