"""A home's stores as the CLI opens them: through pulse_core.open_home, at the store URL
config.json names (the home's own events.db without one; a PostgreSQL database with a
postgresql:// URL; any installed backend's URL), read-only for every query and writable only
for commands that append. What a URL is, is asked of its backend (pulse_core.store's
LogLocation): nothing here knows a backend by name.

No command reads the side store, so the CLI opens the home's own state.db (read-only for a
query): a Redis side store that is down never stops `upulse events`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from pulse_cli import config as config_file
from pulse_cli.home import CliError, Home
from pulse_cli.output import without_passwords
from pulse_core import HomeStores, Principal, StoreError, open_home
from pulse_core.store import parse_side_store_url, parse_store_url


class LogUnavailable(CliError):
    """The event log config.json names cannot be opened (a database server down, a
    password refused, a database that does not exist)."""


def store_url(home: Home, cfg: config_file.Config) -> str:
    """The URL of `home`'s event log: config.json's `store`, else the home's own events.db."""
    return cfg.store or home.layout.store_url()


def shown(url: str) -> str:
    """A store URL as messages show it: without its password."""
    return without_passwords(url)


@contextlib.asynccontextmanager
async def opened(home: Home, *, read_only: bool, cfg: config_file.Config | None = None
                 ) -> AsyncIterator[HomeStores]:
    """The stores of `home`, closed on exit: any home with an event log, whether `upulse
    init` laid it out or an embedded engine wrote it (NotAHome for a folder with neither
    config.json nor events.db). `cfg`: the home's config.json when the caller read it
    already (None: read here).

    `read_only` opens nothing for writing: no writer thread, no schema change, no lock, so a
    query never waits for a running daemon or changes a file or a database. LogUnavailable
    when the log cannot be opened.
    """
    if cfg is None:
        cfg = config_file.load_or_default(home.readable().config)
    stores = await open_stores(home, cfg.store, read_only=read_only)
    try:
        yield stores
    finally:
        await stores.close()


async def open_stores(home: Home, url: str | None, *, read_only: bool,
                      side_store: str | None = None) -> HomeStores:
    """`open_home` on `home` with its event log at the store URL `url` (None: the home's
    own) and its side store at `side_store` (None: the home's own state.db); a log outside
    a file of this machine (on a server) that cannot be opened raises LogUnavailable in one
    line, naming it without its password."""
    try:
        return await open_home(home.root, store=url, side_store=side_store,
                               read_only=read_only, principal=Principal.human("cli"))
    except StoreError as exc:
        if is_file_log(url or home.layout.store_url()):
            raise  # events.db's own errors already name the file and what to do
        raise LogUnavailable(unavailable(url or "", exc)) from None


def unavailable(url: str, exc: BaseException) -> str:
    """The one-line message for a log at `url` that cannot be used: the store's own message
    (which names the server or file), without passwords or line breaks."""
    reason = " ".join(without_passwords(str(exc)).split())
    try:
        location = parse_store_url(url)
    except StoreError:
        return reason
    named = [location.display(), *([str(location.file)] if location.file else [])]
    if any(name in reason for name in named):
        return reason
    return f"the event log at {shown(url)}: {reason}"


def is_file_log(url: str) -> bool:
    """Whether the store URL `url` names a log kept in one file of this machine (SQLite)
    rather than on a server."""
    return parse_store_url(url).file is not None


def served_log(cfg: config_file.Config) -> str | None:
    """config.json's store URL when it names a log outside the files of this machine (a
    database server), else None."""
    return cfg.store if cfg.store is not None and not is_file_log(cfg.store) else None


def served_side_store(cfg: config_file.Config) -> str | None:
    """config.json's side-store URL when it names a store outside the files of this
    machine (a Redis or Valkey server), else None."""
    side = cfg.side_store
    return side if side is not None and parse_side_store_url(side).file is None else None


PROBE_NAMESPACE = "upulse-probe"
"""The side-store namespace `init` and `doctor` read (and never write) to see that a side
store's server answers."""


def log_file(home: Home, cfg: config_file.Config) -> Path | None:
    """The file of `home`'s event log (config.json's store URL, else the layout's own), or
    None when the log lives in a database server."""
    return parse_store_url(store_url(home, cfg)).file
