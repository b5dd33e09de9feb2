"""Every survival threshold in one config, each checked against hard bounds when loaded.

An agent can tune its reflexes, never disable them: a value outside its bounds is refused
with an error naming the field, the value and the range allowed.
"""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

import msgspec

from pulse_core import LLM_ROUTE_KEY, Essential, LayerError, PulseError
from pulse_survival.webhooks import WebhookSecretInvalid, webhook_key


class SurvivalConfigError(PulseError):
    """A survival setting is missing, of the wrong type, or outside its hard bounds."""


def _bounded(where: str, name: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise SurvivalConfigError(
            f"survival.{where}.{name} = {value!r} is outside its hard bounds [{low}, {high}]"
        )


class ResourceThresholds(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """resource_guard: pressure is memory or disk above its percent for `samples` samples."""

    memory_pct: float = 90.0
    disk_pct: float = 90.0
    samples: int = 3
    pressure_tick_ms: int = 1_000
    session_folders: tuple[str, ...] = ()
    temp_folders: tuple[str, ...] = ()
    archive_to: str = "archive"
    older_than_s: int = 7 * 24 * 3600
    max_files_per_run: int = 500

    def __post_init__(self) -> None:
        _bounded("resource", "memory_pct", self.memory_pct, 50, 99)
        _bounded("resource", "disk_pct", self.disk_pct, 50, 99)
        _bounded("resource", "samples", self.samples, 1, 60)
        _bounded("resource", "pressure_tick_ms", self.pressure_tick_ms, 200, 10_000)
        _bounded("resource", "older_than_s", self.older_than_s, 60, 365 * 24 * 3600)
        _bounded("resource", "max_files_per_run", self.max_files_per_run, 1, 100_000)


class ProcessPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """process_watchdog: supervisord's startsecs/startretries, plus a budget per hour."""

    startsecs: float = 1.0
    startretries: int = 3
    budget_per_hour: int = 5
    backoff_initial_s: float = 1.0
    backoff_max_s: float = 60.0

    def __post_init__(self) -> None:
        _bounded("process", "startsecs", self.startsecs, 0, 300)
        _bounded("process", "startretries", self.startretries, 1, 20)
        _bounded("process", "budget_per_hour", self.budget_per_hour, 1, 120)
        _bounded("process", "backoff_initial_s", self.backoff_initial_s, 0.1, 600)
        _bounded("process", "backoff_max_s", self.backoff_max_s, self.backoff_initial_s, 3600)


class LlmPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """llm_watchdog: restart the model proxy after `failures` failed probes in a row."""

    route_key: str = LLM_ROUTE_KEY
    renamed_fields: ClassVar[dict[str, str]] = {"vitals_key": "route_key"}
    failures: int = 3
    restart: Essential | None = None
    backoff_initial_s: float = 5.0
    backoff_max_s: float = 300.0

    def __post_init__(self) -> None:
        if not self.route_key.strip():
            raise SurvivalConfigError(f"survival.llm.route_key must name the vitals key the "
                                      f"route probes write (default {LLM_ROUTE_KEY!r})")
        _bounded("llm", "failures", self.failures, 1, 20)
        _bounded("llm", "backoff_initial_s", self.backoff_initial_s, 0.1, 600)
        _bounded("llm", "backoff_max_s", self.backoff_max_s, self.backoff_initial_s, 3600)


class NetworkTargets(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What the network watcher probes; an outage is DNS and HTTP both failing."""

    dns_names: tuple[str, ...] = ()
    dns_servers: tuple[str, ...] = ()
    dns_port: int = 53
    http_urls: tuple[str, ...] = ()
    timeout_s: float = 3.0
    interval_s: float = 30.0
    samples: int = 2

    def __post_init__(self) -> None:
        _bounded("network", "dns_port", self.dns_port, 1, 65_535)
        _bounded("network", "timeout_s", self.timeout_s, 0.1, 30)
        _bounded("network", "interval_s", self.interval_s, 1, 3600)
        _bounded("network", "samples", self.samples, 1, 20)


class ErrorLogPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """error_escalate: matches in followed logs -> notify (at most one digest every
    `digest_every_s`) and patrol faster for a while. Every pattern must compile."""

    files: tuple[str, ...] = ()
    patterns: tuple[str, ...] = ("ERROR", "CRITICAL", "Traceback")
    patrol_tick_ms: int = 1_000
    patrol_for_s: int = 300
    digest_every_s: int = 300
    max_line_bytes: int = 64 * 1024
    interval_s: float = 5.0

    def __post_init__(self) -> None:
        _bounded("error_log", "interval_s", self.interval_s, 0.5, 600)
        _bounded("error_log", "patrol_tick_ms", self.patrol_tick_ms, 200, 60_000)
        _bounded("error_log", "patrol_for_s", self.patrol_for_s, 10, 86_400)
        _bounded("error_log", "digest_every_s", self.digest_every_s, 10, 86_400)
        _bounded("error_log", "max_line_bytes", self.max_line_bytes, 256, 16 * 1024 * 1024)
        for n, pattern in enumerate(self.patterns):
            try:
                re.compile(pattern.encode())  # as the watcher compiles it: over bytes
            except (re.error, UnicodeEncodeError) as exc:
                raise SurvivalConfigError(
                    f"survival.error_log.patterns[{n}] = {pattern!r} is not a valid regular "
                    f"expression: {exc} — fix or remove the pattern") from None


class RollbackPolicy(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """panic_rollback and auto_rollback thresholds."""

    panic_failures: int = 3
    auto_errors: int = 5
    auto_window_s: int = 600

    def __post_init__(self) -> None:
        _bounded("rollback", "panic_failures", self.panic_failures, 2, 20)
        _bounded("rollback", "auto_errors", self.auto_errors, 1, 1_000)
        _bounded("rollback", "auto_window_s", self.auto_window_s, 60, 86_400)


class NotifySinks(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where notifications go: always an event for the agent; optionally a log and a webhook
    (an http or https URL with a host), signed when `webhook_secret` is set (a `whsec_`
    secret, see pulse_survival.new_webhook_secret). The secret never shows in a repr."""

    log_file: str | None = None
    webhook_url: str | None = None
    webhook_timeout_s: float = 5.0
    webhook_secret: str | None = None

    def __post_init__(self) -> None:
        _bounded("notify", "webhook_timeout_s", self.webhook_timeout_s, 0.1, 60)
        if self.webhook_url:  # empty: no webhook, as the executor reads it
            _check_webhook(self.webhook_url)
        if self.webhook_secret is not None:
            _check_secret(self.webhook_secret, self.webhook_url)

    def __repr__(self) -> str:
        url = self.webhook_url and "<set>"  # a webhook URL often carries a token too
        secret = self.webhook_secret and "<set>"
        return (f"NotifySinks(log_file={self.log_file!r}, webhook_url={url!r}, "
                f"webhook_timeout_s={self.webhook_timeout_s!r}, webhook_secret={secret!r})")


def _check_secret(secret: str, url: str | None) -> None:
    """Refuse a webhook secret that is malformed, or set with no webhook to sign for. The
    message never repeats the secret."""
    if not url:
        raise SurvivalConfigError("survival.notify.webhook_secret is set but "
                                  "survival.notify.webhook_url is not — set the URL the "
                                  "signed notices go to, or remove the secret")
    try:
        webhook_key(secret)
    except WebhookSecretInvalid as exc:
        raise SurvivalConfigError(f"survival.notify.webhook_secret: {exc}") from None


def _check_webhook(url: str) -> None:
    """Refuse a webhook URL that is not http(s) with a host. The message never repeats the
    URL, which may carry a token: only its scheme and host."""
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port  # .port raises on a port out of range
    except ValueError:
        raise SurvivalConfigError("survival.notify.webhook_url is not a valid URL — give "
                                  "an http:// or https:// URL") from None
    if parts.scheme not in ("http", "https") or not host:
        shown = f"{parts.scheme}://{host or ''}" if parts.scheme else "a URL without a scheme"
        raise SurvivalConfigError(
            f"survival.notify.webhook_url must be an http:// or https:// URL with a host, "
            f"not {shown} — the webhook is POSTed over HTTP")


class SurvivalConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """The whole survival layer's settings; every field has a documented default."""

    resource_interval_s: float = 5.0
    disk_paths: tuple[str, ...] = ()
    processes: tuple[Essential, ...] = ()
    process: ProcessPolicy = ProcessPolicy()
    resource: ResourceThresholds = ResourceThresholds()
    llm: LlmPolicy = LlmPolicy()
    network: NetworkTargets = NetworkTargets()
    error_log: ErrorLogPolicy = ErrorLogPolicy()
    rollback: RollbackPolicy = RollbackPolicy()
    notify: NotifySinks = NotifySinks()

    def __post_init__(self) -> None:
        _bounded("", "resource_interval_s", self.resource_interval_s, 1, 600)
        names = [p.name for p in self.processes]
        if len(set(names)) != len(names):
            raise SurvivalConfigError(f"survival.processes names must be unique: {names}")


def _settings_in(annotation: Any) -> type[msgspec.Struct] | None:
    """The settings Struct a field holds (itself, in a tuple, or optional), if any."""
    candidates = typing.get_args(annotation) or (annotation,)
    for candidate in candidates:
        if isinstance(candidate, type) and issubclass(candidate, msgspec.Struct):
            return candidate
    return None


def unknown_field(key: str, allowed: Sequence[str], where: str,
                  renamed: Mapping[str, str] | None = None) -> str:
    """The message for `key`, which is not one of the `allowed` fields at `where`: its new
    name when `renamed` gives one, else the closest allowed name when one is close, then
    every allowed name in declared order."""
    close = difflib.get_close_matches(key, allowed, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    if renamed and key in renamed:
        hint = f" (renamed: now {renamed[key]!r})"
    return f"{where}: unknown field {key!r}{hint} — allowed: {', '.join(allowed)}"


def _check_names(data: Any, cls: type[msgspec.Struct], where: str) -> None:
    """Refuse a key `cls` does not have, naming where it is and the keys allowed there."""
    if not isinstance(data, Mapping):
        return  # not an object: msgspec names the type it expected
    fields = {f.encode_name: f for f in msgspec.structs.fields(cls)}
    for key, value in data.items():
        field = fields.get(key)
        if field is None:
            raise SurvivalConfigError(unknown_field(str(key), tuple(fields), where,
                                                    getattr(cls, "renamed_fields", None)))
        inner = _settings_in(field.type)
        if inner is None:
            continue
        if isinstance(value, list | tuple):
            for n, item in enumerate(value):
                _check_names(item, inner, f"{where}.{key}[{n}]")
        else:
            _check_names(value, inner, f"{where}.{key}")


def load_config(data: Mapping[str, Any] | None = None, *,
                path: Path | None = None) -> SurvivalConfig:
    """A SurvivalConfig from a mapping (config.json's `survival` object), or from a JSON file
    at `path`. Errors name the field: an unknown one with the fields allowed beside it, a
    value of the wrong type or outside its hard bounds with what was expected."""
    if path is not None:
        try:
            data = msgspec.json.decode(path.read_bytes())
        except msgspec.DecodeError as exc:
            raise SurvivalConfigError(f"survival config {path}: not valid JSON — {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise SurvivalConfigError(f"survival settings must be a JSON object of "
                                  f"SurvivalConfig fields, not {type(data).__name__}")
    _check_names(data, SurvivalConfig, "survival")
    try:
        return msgspec.convert(dict(data), SurvivalConfig)
    except LayerError as exc:  # an essential process (pulse_core.Essential) refused itself
        raise SurvivalConfigError(f"survival: {exc}") from None
    except msgspec.ValidationError as exc:
        problem, _, at = str(exc).rpartition(" - at `$")
        where = f"survival{at.rstrip('`')}" if problem else "survival"
        problem = problem or str(exc)
        todo = "add it" if problem.startswith("Object missing") else "fix the value"
        raise SurvivalConfigError(f"{where}: {problem[:1].lower()}{problem[1:]} — {todo}"
                                  ) from None
