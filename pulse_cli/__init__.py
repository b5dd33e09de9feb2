"""pulse_cli: the `upulse` command — engine directories, promote and rollback, the daemon.

Its face gives config.json's parser and the engine directory's building blocks
(`init_engine_dir`, `revision`, `load_code`, `build_engine`); the command itself is
`pulse_cli.main.main(argv)`, the module the `upulse` script runs."""

from pulse_cli.assembly import build_engine, load_code
from pulse_cli.config import ConfigError, parse_config
from pulse_cli.enginedir import init_engine_dir, revision

__all__ = [
    "ConfigError",
    "build_engine",
    "init_engine_dir",
    "load_code",
    "parse_config",
    "revision",
]
