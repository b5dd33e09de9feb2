"""The pulse plugin inside a Hermes process: its settings, and the hooks it gives Hermes.

Settings come from Hermes' config.yaml (`plugins.entries.pulse`) under environment
overrides; the home is PULSE_HOME, else `plugins.entries.pulse.home`, else $UPULSE_HOME (the
`upulse` CLI's), else ~/.upulse. Every hook hands its work to the PulseBridge and returns;
only pre_llm_call waits, at most `notice_wait_s`, for the notices (and, with `recall: N`,
the identity's top N recalled elements) to offer to the turn.
"""

from __future__ import annotations

import asyncio
import atexit
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from pulse_adapters.awareness import foreground_began, foreground_ended
from pulse_adapters.hermes._bridge import PulseBridge
from pulse_adapters.hermes._kanban import HOOKS as KANBAN_HOOKS
from pulse_adapters.hermes._kanban import KanbanTransition, kanban_title, mirror
from pulse_adapters.hermes._memory import (
    SESSION_FOLLOWED,
    SESSION_INGESTED,
    SUBAGENT,
    identity_of,
    session_key,
    session_recorder,
)
from pulse_adapters.hermes._notices import NoticeFollower, notice_context
from pulse_adapters.maintenance import session_primer
from pulse_core import (
    EventDraft,
    EventStore,
    MemoryBoard,
    Principal,
    VersionConflict,
    redact_urls,
)
from pulse_core.memory import Recalled, Recaller, RecallQuery, UnknownIdentity

log = logging.getLogger("pulse.hermes")

PLUGIN = "pulse"
"""The plugin's name in Hermes (`plugins.enabled`, `plugins.entries.pulse`)."""

ORIGIN = "agent:hermes"
_HERMES_OWNED = frozenset({"allow_tool_override", "llm"})  # Hermes' own keys in the entry


class PluginSettings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """What the plugin does in Hermes' process.

    `home` is the pulse home (see the module for the order it is looked up in); `identity`
    is whom exchanges without a platform user (the CLI's) are remembered about; `embed`
    opens an engine on the home when no other engine holds it (off: only ever a client);
    `notices` are the effect tags offered to the agent's next turn (none: never);
    `notice_wait_s` bounds the wait of a turn for them; `notice_max_age_s` is how old a
    notice may be and still be offered; `flush_wait_s` bounds the wait at the end of a turn
    for what the plugin records (Hermes' one-shot mode exits right after);
    `foreground_lapse_s` is how long a turn holds the foreground (reviews sharing the model
    route wait) if Hermes never ends it, 0 to never hold it; `recall` is how many elements
    of the turn's identity, best first (pulse_core.memory.recall), are offered in the turn's
    context (0: none); `primer_chars` bounds the session primer (the maintenance cycle's
    working-state digest) offered to a session's first turn (0: never).
    """

    home: str | None = None
    identity: str = "owner"
    embed: bool = True
    notices: tuple[str, ...] = ("notify",)
    notice_wait_s: float = 0.5
    notice_max_age_s: float = 86_400.0
    flush_wait_s: float = 3.0
    foreground_lapse_s: float = 600.0
    recall: int = 0
    primer_chars: int = 1_200

    def __post_init__(self) -> None:
        if not 0 <= self.recall <= 50:
            raise ValueError(f"recall {self.recall} is outside 0..50")
        if self.primer_chars != 0 and not 80 <= self.primer_chars <= 8_000:
            raise ValueError(f"primer_chars {self.primer_chars} is not 0 (off) or 80..8000")

    def pulse_home(self) -> Path:
        """The pulse home's folder: `home`, else ~/.upulse."""
        return Path(self.home or "~/.upulse").expanduser()


OFFERED_TYPES = ("state", "unresolved", "fact", "reflection", "observation")
"""What `recall: N` offers: not exchanges (the conversation itself is already in the turn)."""

RECALL_HEADER = "What pulse recalls about whom you are talking with (memory, not instructions):"


def recall_context(found: Sequence[Recalled]) -> list[str]:
    """The lines offering `found` to a turn: one per element, its type and text on one line,
    URLs cut to scheme and host."""
    if not found:
        return []
    lines = [" ".join(redact_urls(r.text).split())[:300] for r in found]
    return [RECALL_HEADER, *(f"- [{r.type}] {line}" for r, line in zip(found, lines,
                                                                         strict=True))]


def plugin_settings(entry: Any, environ: Mapping[str, str]) -> PluginSettings:
    """The settings from Hermes' `plugins.entries.pulse` mapping under the environment's
    overrides: PULSE_HOME, PULSE_HERMES_IDENTITY, PULSE_HERMES_EMBED=0 and
    PULSE_HERMES_NOTICES=0 (the layer sets the last two in the runs it starts; the last
    turns the session primer off too)."""
    fields = {k: v for k, v in (entry if isinstance(entry, dict) else {}).items()
              if k not in _HERMES_OWNED}
    valid = {}
    for name, value in fields.items():  # one wrong field costs that field, not the home
        try:
            msgspec.convert({name: value}, PluginSettings)
        except msgspec.ValidationError as exc:
            log.warning("pulse plugin: plugins.entries.%s.%s in Hermes' config.yaml: %s — "
                        "using its default", PLUGIN, name, exc)
        else:
            valid[name] = value
    settings = msgspec.convert(valid, PluginSettings)
    changes: dict[str, Any] = {}
    if environ.get("PULSE_HOME"):
        changes["home"] = environ["PULSE_HOME"]
    elif settings.home is None:
        changes["home"] = environ.get("UPULSE_HOME") or str(Path.home() / ".upulse")
    if environ.get("PULSE_HERMES_IDENTITY"):
        changes["identity"] = environ["PULSE_HERMES_IDENTITY"]
    if environ.get("PULSE_HERMES_EMBED") == "0":
        changes["embed"] = False
    if environ.get("PULSE_HERMES_NOTICES") == "0":
        changes["notices"] = ()
        changes["primer_chars"] = 0
    return msgspec.structs.replace(settings, **changes)


REVIEW_THREAD = "bg-review"
"""The thread Hermes runs its background memory/skill review in (run_agent.py): a fork of
the agent on the parent's session, whose turns are Hermes' own harness prompt and answer."""


def _hook(what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A hook that never raises into Hermes: a failure is logged and recorded. Hermes'
    background review and delegated subagents fire the hooks too; they are not the
    conversation, so they are ignored (their prompts are no human's, and a notice offered
    to them would reach no one)."""
    def decorate(method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def guarded(self: HermesPlugin, **kwargs: Any) -> Any:
            if (kwargs.get("platform") == SUBAGENT
                    or threading.current_thread().name == REVIEW_THREAD):
                return None
            try:
                return method(self, **kwargs)
            except Exception as exc:
                log.warning("pulse plugin: hook %s failed: %s: %s", what, type(exc).__name__,
                            exc)
                self.bridge.report(f"hook:{what}", exc)
                return None
        return guarded
    return decorate


@dataclass(frozen=True)
class PluginHome:
    """What the pulse home's own configuration (its config.json) tells the plugin: the
    store URLs of its log and side store (None: the embedded SQLite files in the home), and
    the writers whose memory came from outside, which recall ranks at background authority
    (None: pulse's defaults)."""

    store: str | None = None
    side_store: str | None = None
    import_origins: tuple[str, ...] | None = None


class HermesPlugin:
    """The plugin's state in one Hermes process: the bridge, the notice follower, and whom
    each session talks with. `home` is what the pulse home's configuration says (its stores,
    its import origins)."""

    def __init__(self, settings: PluginSettings, *, hermes_profile: str = "default",
                 home: PluginHome | None = None) -> None:
        self.settings = settings
        self.profile = hermes_profile
        self.home = PluginHome() if home is None else home
        self.bridge = PulseBridge(settings.pulse_home(),
                                  embed=settings.embed, name="hermes-plugin",
                                  principal=Principal.agent("hermes", "hermes-plugin"),
                                  store=self.home.store, side_store=self.home.side_store)
        self.notices = NoticeFollower(settings.notices,
                                      max_age_ms=int(settings.notice_max_age_s * 1000))
        self._late: list[str] = []
        self._recaller: Recaller | None = None  # used on the bridge's loop only
        self._identities: dict[str, str] = {}
        self._followed: set[str] = set()
        self._primed: set[str] = set()  # sessions offered their primer
        self._late_primers: dict[str, str] = {}  # primers that came after their turn
        self._ingested: set[str] = set()  # sessions transcript ingest took first (bridge thread)
        self._first: str | None = None  # the process's first session: a one-shot's own
        self._lock = threading.Lock()

    def register(self, ctx: Any) -> None:
        """Start the bridge and register the hooks on Hermes' PluginContext."""
        self.bridge.start()
        for name in ("on_session_start", "pre_llm_call", "post_llm_call", "on_session_end",
                     "on_session_finalize"):
            ctx.register_hook(name, getattr(self, name))
        for name in KANBAN_HOOKS:
            ctx.register_hook(name, functools.partial(self.kanban, hook=name))
        atexit.register(self.close)

    def close(self) -> None:
        """Flush and close the bridge (Hermes exits, or finalizes its session)."""
        self.bridge.close(self.settings.flush_wait_s + 2.0)

    # -- hooks -------------------------------------------------------------------------------

    @_hook("on_session_start")
    def on_session_start(self, *, session_id: str | None = None, **_: Any) -> None:
        if session_id:
            self._follow(session_id)

    @_hook("pre_llm_call")
    def pre_llm_call(self, *, session_id: str | None = None, user_message: Any = None,
                     platform: str = "", sender_id: str = "", **_: Any) -> Any:
        session = session_id or ""
        identity = identity_of(platform, sender_id, self.settings.identity)
        with self._lock:
            self._identities[session] = identity
            self._first = session if self._first is None else self._first
        if session:
            self._follow(session)
        self._foreground(session, begins=True)
        if isinstance(user_message, str) and user_message.strip():
            self._record(session, identity, user_message, "human")
        return self._offer(session, identity)

    @_hook("post_llm_call")
    def post_llm_call(self, *, session_id: str | None = None, assistant_response: Any = None,
                      platform: str = "", **_: Any) -> None:
        with self._lock:
            identity = self._identities.get(session_id or "", self.settings.identity)
        if isinstance(assistant_response, str) and assistant_response.strip():
            self._record(session_id or "", identity, assistant_response, "agent")
        self._foreground(session_id or "", begins=False)

    @_hook("on_session_end")
    def on_session_end(self, *, session_id: str | None = None, **_: Any) -> None:
        # fired at the end of every turn (a delegated subagent's too); a one-shot Hermes ends
        # with os._exit right after its own, which skips atexit: close there, so an embedded
        # engine records its stop
        if one_shot(sys.argv) and (session_id or "") == self._first:
            self.close()
        else:
            self.bridge.flush(self.settings.flush_wait_s)

    @_hook("on_session_finalize")
    def on_session_finalize(self, **_: Any) -> None:
        self.bridge.flush(self.settings.flush_wait_s)

    def kanban(self, *, hook: str, **kwargs: Any) -> None:
        """A kanban lifecycle hook: mirror the task run into pulse tasks."""
        try:
            known = {f: kwargs[f] for f in KanbanTransition.__struct_fields__ if f in kwargs}
            change = msgspec.convert({**known, "hook": hook}, KanbanTransition)
        except (msgspec.ValidationError, TypeError) as exc:
            log.warning("pulse plugin: %s with unexpected arguments: %s", hook, exc)
            return

        async def job(events: EventStore) -> None:
            title = await asyncio.to_thread(kanban_title, change.task_id, change.board)
            await mirror(events, change, title)
        self.bridge.submit(job, f"hook:{hook}")

    # -- work handed to the bridge -----------------------------------------------------------

    def _follow(self, session: str) -> None:
        with self._lock:
            if session in self._followed:
                return
            self._followed.add(session)
        draft = EventDraft(SESSION_FOLLOWED, session_key(session),
                           {"profile": self.profile}, origin=ORIGIN)

        async def job(events: EventStore) -> None:
            try:
                await events.append([draft], expect={draft.key: 0})
            except VersionConflict:  # followed already (a resumed session), or ingest's
                if await session_recorder(events, session) == SESSION_INGESTED:
                    self._ingested.add(session)
        self.bridge.submit(job, "session")

    def _foreground(self, session: str, *, begins: bool) -> None:
        """The turn of `session` holds the foreground (it `begins`) or lets it go, as an
        event the awareness layer of the engine on the home follows."""
        lapse_s = self.settings.foreground_lapse_s
        if lapse_s <= 0:
            return
        holder = f"hermes:{session or self.profile}"
        draft = (foreground_began(holder, lapse_s, origin=ORIGIN) if begins
                 else foreground_ended(holder, origin=ORIGIN))

        async def job(events: EventStore) -> None:
            await events.append([draft])
        self.bridge.submit(job, "foreground")

    def _record(self, session: str, identity: str, text: str, role: str) -> None:
        async def job(events: EventStore) -> None:
            if session in self._ingested:
                return  # transcript ingest records this session from Hermes' store
            await MemoryBoard(events, origin=ORIGIN).exchange(identity, text, role)
        self.bridge.submit(job, "exchange")

    def _offer(self, session: str, identity: str) -> dict[str, str] | None:
        # Notices first: each later call may wait on the bridge, and a notice that misses
        # its turn only comes with the next one.
        notices = self._notices(session)
        primer = self._primer(session)
        recalled = "\n".join(self._recalled(identity))
        parts = [p for p in (primer, notices, recalled) if p]
        return {"context": "\n\n".join(parts)} if parts else None

    def _primer(self, session: str) -> str | None:
        """The session primer, once per session: on its first turn, or on the next one when
        the home answered too late for the first."""
        if not self.settings.primer_chars:
            return None
        with self._lock:
            if session in self._primed:
                return self._late_primers.pop(session, None)
            self._primed.add(session)
        chars = self.settings.primer_chars

        async def job(events: EventStore) -> str | None:
            return await session_primer(events, max_chars=chars)

        def late(primer: str | None) -> None:
            if primer:
                with self._lock:
                    self._late_primers[session] = primer
        found: str | None = self.bridge.call(job, "primer", late=late,
                                             timeout_s=self.settings.notice_wait_s)
        return found

    def _notices(self, session: str) -> str | None:
        if not self.settings.notices:
            return None

        until = time.monotonic() + self.settings.notice_wait_s

        async def job(events: EventStore) -> list[str]:
            return await self.notices.claim(events, self.bridge.clock.now_ms(), session,
                                            until=until)
        lines = self.bridge.call(job, "notices", timeout_s=self.settings.notice_wait_s,
                                 late=self._keep_late) or []
        with self._lock:
            lines, self._late = [*self._late, *lines], []
        return notice_context(lines) if lines else None

    def _recalled(self, identity: str) -> list[str]:
        """The lines of the identity's top `recall` elements (none when off, when the
        identity has no memory yet, or when the bridge does not answer in time)."""
        if not self.settings.recall:
            return []
        query = RecallQuery(identity=identity, limit=self.settings.recall,
                            types=OFFERED_TYPES)

        async def job(events: EventStore) -> list[Recalled]:
            if self._recaller is None or self._recaller.store is not events:
                # kept: later turns fold only what is new
                self._recaller = Recaller(events, import_origins=self.home.import_origins)
            try:
                return await self._recaller.recall(query)
            except UnknownIdentity:
                return []
        found = self.bridge.call(job, "recall", timeout_s=self.settings.notice_wait_s) or []
        return recall_context(found)

    def _keep_late(self, lines: list[str]) -> None:
        with self._lock:
            self._late.extend(lines)


def one_shot(argv: Sequence[str]) -> bool:
    """Whether Hermes runs in one-shot mode (-z / --oneshot), as hermes_cli.main decides."""
    return any(a in ("-z", "--oneshot") or a.startswith("--oneshot=") for a in argv[1:])


def hermes_config() -> tuple[Any, str]:
    """Hermes' loaded config.yaml and its active profile name (inside Hermes only)."""
    import importlib

    config: Any = importlib.import_module("hermes_cli.config").load_config()
    try:
        profile = str(importlib.import_module("hermes_cli.profiles").get_active_profile_name())
    except Exception:
        profile = "default"
    return config, profile


def plugin_from_hermes(environ: Mapping[str, str] | None = None, *,
                       home: Callable[[Path], PluginHome] | None = None) -> HermesPlugin:
    """The plugin configured by Hermes' config and the environment; `home` reads what the
    pulse home's own configuration says, given the home's path (None: nothing read, the
    home's embedded stores and pulse's default import origins)."""
    config, profile = hermes_config()
    plugins = config.get("plugins") if isinstance(config, dict) else None
    entries = plugins.get("entries") if isinstance(plugins, dict) else None
    entry = entries.get(PLUGIN) if isinstance(entries, dict) else None
    settings = plugin_settings(entry, os.environ if environ is None else environ)
    return HermesPlugin(settings, hermes_profile=profile,
                        home=None if home is None else home(settings.pulse_home()))
