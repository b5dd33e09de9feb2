"""HOME/config.json: one file for the CLI, the daemon, the survival layer and the configured
layers, checked on load.

Every error names the file, the field, what values are allowed and what was found, or, for
text that is not JSON, the line and column::

    config.json: daemon.drain_timeout_s must be a number > 0, got "soon"
    config.json: not valid JSON at line 4, column 7: invalid character

The shape of `layers` is checked here; each layer's own settings are checked by the layer's
factory when the engine is built (pulse_cli.assembly), which names the layer.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import secrets
import socket
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from pulse_cli.home import CliError, check_instance_name
from pulse_cli.loader import MAX_TICK_MS, MIN_TICK_MS
from pulse_cli.output import without_passwords
from pulse_core import (
    MAX_HOST_LENGTH,
    PRIVATE_FILE,
    PulseError,
    check_host,
    denied,
    parse_store_url,
    write_private,
)
from pulse_core.store import parse_side_store_url

if TYPE_CHECKING:
    from pulse_survival import SurvivalConfig


class ConfigError(CliError):
    """config.json is missing, not JSON, or has a field that is unknown or out of range."""


LogFormat = Literal["text", "json"]
"""What daemon.log's lines are: text for people, or one JSON object a line (JSON lines)."""
LOG_FORMATS: tuple[str, ...] = typing.get_args(LogFormat)


class DaemonSettings(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """How the daemon stops, how big its log may grow before it is rotated, and whether its
    lines are text or JSON (pulse_cli.daemon_log)."""

    drain_timeout_s: Annotated[float, msgspec.Meta(gt=0, le=3600)] = 10.0
    log_max_bytes: Annotated[int, msgspec.Meta(ge=4096)] = 10 * 1024 * 1024
    log_format: LogFormat = "text"


class ConfigFile(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """config.json as stored; `survival` is checked by pulse_survival.load_config, each
    layer's settings by that layer's factory."""

    instance: str = "default"
    default_tick_ms: Annotated[int, msgspec.Meta(ge=MIN_TICK_MS, le=MAX_TICK_MS)] = 5_000
    daemon: DaemonSettings = DaemonSettings()
    survival: dict[str, Any] = {}
    store: str | None = None
    side_store: str | None = None
    host: str | None = None
    layers: dict[str, dict[str, Any] | None] = {}
    mcp: dict[str, Any] | None = None


@dataclass(frozen=True)
class Config:
    """A home's settings, validated. `store` is the event log's URL (None: the home's own
    log, as pulse_core._home.HomeLayout names it); `side_store` the side store's URL (None:
    the home's own state.db); `host` the name this engine's claims and its engine directory's
    events give its host (None: the one kept in HOME/host.id, see `home_host`); `layers`
    maps each configured layer's name to its settings, in order."""

    instance: str
    default_tick_ms: int
    daemon: DaemonSettings
    survival: SurvivalConfig
    store: str | None = None
    side_store: str | None = None
    host: str | None = None
    layers: Mapping[str, dict[str, Any] | None] = field(default_factory=dict)
    mcp: Mapping[str, Any] | None = None


# What each field allows, in the words of an error message.
ALLOWED: dict[str, str] = {
    "": "a JSON object",
    "instance": "an instance name (letters, digits, '.', '_', '-')",
    "default_tick_ms": f"an integer from {MIN_TICK_MS} to {MAX_TICK_MS}",
    "daemon": "an object with drain_timeout_s, log_max_bytes and log_format",
    "daemon.drain_timeout_s": "a number > 0 and <= 3600",
    "daemon.log_max_bytes": "an integer >= 4096",
    "daemon.log_format": " or ".join(f'"{f}"' for f in LOG_FORMATS) + " (default \"text\")",
    "survival": "an object of pulse_survival.SurvivalConfig settings",
    "store": ("a store URL such as \"sqlite:///abs/path/events.db\" or "
              "\"postgresql://user@host:5432/db\" (null: the home's own log)"),
    "side_store": ("a side-store URL such as \"redis://host:6379/0\" or "
                   "\"sqlite:///abs/path/state.db\" (null: the home's own state.db)"),
    "host": ("a host name for this engine's claims, 1-255 printable characters without "
             "spaces, one per home (null: a name made once for this home, kept in host.id)"),
    "layers": "an object mapping each layer's name to its settings, in order",
    "layers.*": "an object of that layer's settings, or null",
    "mcp": "the MCP server's settings, {\"agent\": NAME, ...} (docs/mcp.md), or null",
}
_FIELDS: dict[str, tuple[str, ...]] = {
    "": tuple(ConfigFile.__struct_fields__),
    "daemon": tuple(DaemonSettings.__struct_fields__),
}
_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
_BYTE = re.compile(r"^(?:JSON is malformed: )?(?P<what>.*?)(?: \(byte (?P<byte>\d+)\))?$")
MAX_DEPTH = 32
"""How deeply config.json may nest objects and arrays (settings need a few levels)."""
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`")


def _lookup(raw: Any, path: str) -> Any:
    value = raw
    parts = path.split(".", 1) if path.startswith("layers.") else path.split(".")
    for part in filter(None, parts):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _generic(path: str) -> str:
    """`layers.awareness` -> `layers.*`: the key of ALLOWED that describes `path`."""
    return "layers.*" if path.startswith("layers.") else path


def _explain(exc: msgspec.ValidationError, raw: Any, name: str) -> ConfigError:
    text = str(exc)
    match = _AT.search(text)
    path = match.group("path") if match else ""
    unknown = _UNKNOWN.match(text)
    if unknown:
        from pulse_survival import unknown_field  # one wording for every config

        where = f"{name}: {path}" if path else name
        return ConfigError(unknown_field(unknown.group("name"), _FIELDS.get(path, ()), where))
    if path == "layers[...]":  # msgspec does not name the key: find the layer it means
        layers = raw.get("layers") if isinstance(raw, dict) else None
        bad = [k for k, v in (layers or {}).items() if not isinstance(v, dict | None)]
        path = f"layers.{bad[0]}" if bad else "layers"
    allowed = ALLOWED.get(_generic(path), "a valid value")
    got = json.dumps(_lookup(raw, path))
    return ConfigError(f"{name}: {path or 'the file'} must be {allowed}, got {got}")


def _not_json(data: bytes, exc: msgspec.DecodeError, name: str) -> ConfigError:
    """The error for bytes that are not JSON, at the line and column where reading stopped."""
    match = _BYTE.match(str(exc))
    what = match["what"] if match else str(exc)
    at = int(match["byte"]) if match and match["byte"] else len(data)  # no byte: cut short
    if what == "trailing characters":
        at -= 1  # msgspec counts the first trailing character as read
    at = max(min(at, len(data)), 0)
    line = data.count(b"\n", 0, at) + 1
    column = len(data[data.rfind(b"\n", 0, at) + 1:at].decode(errors="replace")) + 1
    return ConfigError(f"{name}: not valid JSON at line {line}, column {column}: "
                       f"{what[:1].lower()}{what[1:]} — fix it there")


def _too_deep(raw: Any, name: str) -> ConfigError | None:
    """The error for a document nesting objects or arrays deeper than MAX_DEPTH, naming
    where (None when it does not)."""
    stack: list[tuple[Any, str, int]] = [(raw, "", 0)]
    while stack:
        value, path, depth = stack.pop()
        if not isinstance(value, dict | list):
            continue
        if depth >= MAX_DEPTH:
            return ConfigError(f"{name}: {path or 'the file'} nests objects or arrays more than "
                               f"{MAX_DEPTH} levels deep — no setting needs that; flatten it")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        stack.extend((v, f"{path}.{k}" if path else str(k), depth + 1) for k, v in items)
    return None


def parse_config(data: bytes, name: str = "config.json") -> Config:
    """A Config from the bytes of a config file; ConfigError names any bad field, or the
    line and column of text that is not JSON."""
    from pulse_survival import SurvivalConfigError, load_config  # its checks, its bounds

    try:
        raw = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise _not_json(data, exc, name) from None
    except RecursionError:
        raise ConfigError(f"{name}: nests objects or arrays more than {MAX_DEPTH} levels deep "
                          "— no setting needs that; flatten it") from None
    deep = _too_deep(raw, name)
    if deep is not None:
        raise deep
    try:
        stored = msgspec.convert(raw, ConfigFile)
    except msgspec.ValidationError as exc:
        raise _explain(exc, raw, name) from None
    try:
        check_instance_name(stored.instance)
    except CliError:
        got = json.dumps(stored.instance)
        raise ConfigError(f"{name}: instance must be {ALLOWED['instance']}, got {got}") from None
    try:
        survival = load_config(stored.survival)
    except SurvivalConfigError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    _check_store(stored.store, name)
    _check_side_store(stored.side_store, name)
    _check_host(stored.host, name)
    _check_layers(stored.layers, name)
    return Config(stored.instance, stored.default_tick_ms, stored.daemon, survival,
                  stored.store, stored.side_store, stored.host, dict(stored.layers),
                  stored.mcp)


def _check_store(url: str | None, name: str) -> None:
    if url is None:
        return
    try:
        parse_store_url(url)
    except PulseError as exc:
        raise ConfigError(f"{name}: store: {without_passwords(str(exc))}") from None


def _check_side_store(url: str | None, name: str) -> None:
    if url is None:
        return
    try:
        parse_side_store_url(url)
    except PulseError as exc:
        raise ConfigError(f"{name}: side_store: {without_passwords(str(exc))}") from None


def _check_host(host: str | None, name: str) -> None:
    if host is None:
        return
    try:
        check_host(host)
    except PulseError:
        raise ConfigError(f"{name}: host must be {ALLOWED['host']}, got {json.dumps(host)}"
                          ) from None


def _check_layers(layers: Mapping[str, Any], name: str) -> None:
    if "survival" in layers:
        raise ConfigError(f"{name}: layers.survival: the survival layer always runs and is "
                          'not listed under "layers"; its settings go under "survival"')
    for layer in layers:
        if not layer or layer != layer.strip():
            raise ConfigError(f"{name}: layers: {json.dumps(layer)} is not a layer name")


def on_scratch(cfg: Config) -> Config:
    """`cfg` for an engine on a scratch copy of its home (`upulse tick`, `upulse dev`, the
    promote gate's dry run): the copy's own event log and side store, never the live ones
    config.json names."""
    return dataclasses.replace(cfg, store=None, side_store=None)


def load(path: Path) -> Config:
    """The Config in `path`; ConfigError if it is missing or invalid."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path} does not exist — run `upulse init` to create it") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read it — {exc}") from None
    return parse_config(data, str(path))


def load_or_default(path: Path) -> Config:
    """The Config in `path`, or every default when there is no such file (a home laid out
    without `upulse init`, as in tests); ConfigError if it exists and is invalid."""
    return load(path) if path.is_file() else parse_config(b"{}", str(path))


def default_config_text(instance: str, *, store: str | None = None,
                        side_store: str | None = None, host: str | None = None) -> str:
    """The config.json `upulse init` writes: every setting at its default, but the store
    URLs and the host name given (`upulse init --store URL --side-store URL --host NAME`)."""
    stored = ConfigFile(instance=instance, store=store, side_store=side_store, host=host)
    return msgspec.json.format(msgspec.json.encode(stored), indent=2).decode() + "\n"


def write_default(path: Path, instance: str, *, store: str | None = None,
                  side_store: str | None = None, host: str | None = None) -> None:
    """Write a default config.json for `instance` (with the store URLs and host name given)
    atomically, readable by its owner only."""
    write_private(path, default_config_text(instance, store=store, side_store=side_store,
                                            host=host).encode())


# -- the home's host name ------------------------------------------------------------------------

HOST_FILE = "host.id"
"""The file in a home that keeps the host name made for it when config.json's `host` is null."""


def new_host_name() -> str:
    """A host name no other home has: this machine's hostname and six random hex digits.

    Homes sharing a log (PostgreSQL) tell their engine directories' events apart by it, so
    two homes of one machine must not share one; that they differ is safe for claims too (a
    loop judges another host's claims by their lease alone)."""
    suffix = f"-{secrets.token_hex(3)}"
    machine = "".join(c for c in socket.gethostname() if c.isprintable() and not c.isspace())
    return check_host((machine or "host")[:MAX_HOST_LENGTH - len(suffix)] + suffix)


def home_host(root: Path, cfg: Config) -> str:
    """The host name of the engine of the home `root` with settings `cfg`: config.json's
    `host`, else the one kept in `root`/host.id, made once (new_host_name) by the first
    process that asks and read by every later one. ConfigError when host.id holds no host
    name."""
    if cfg.host is not None:
        return cfg.host
    path = root / HOST_FILE
    if not path.exists():
        _keep_once(path, f"{new_host_name()}\n".encode())
    try:
        return check_host(path.read_text(encoding="utf-8").strip())
    except (OSError, UnicodeDecodeError, PulseError) as exc:
        raise ConfigError(f"{path}: cannot read this home's host name ({exc}) — write there "
                          "one line, 1-255 printable characters without spaces, or set "
                          f"\"host\" in {root / 'config.json'}") from None


def _keep_once(path: Path, data: bytes) -> None:
    """Create `path` (0600) holding `data` unless it exists; of two processes creating it at
    once, the first one's is kept whole and the other's dropped."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
    except PermissionError:
        raise denied(path, "create") from None
    try:
        with os.fdopen(fd, "wb") as out:
            os.fchmod(out.fileno(), PRIVATE_FILE)  # the umask may have taken bits away
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        with contextlib.suppress(FileExistsError):  # another process's came first: it stays
            os.link(tmp, path)
    finally:
        os.unlink(tmp)
