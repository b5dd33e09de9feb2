"""A home's stores as the CLI opens them: through pulse_core._home.open_home, at the store URL
config.json names (the home's own events.db without one), read-only for every query and
writable only for commands that append."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from pulse_cli import config as config_file
from pulse_cli.home import Home
from pulse_core import HomeStores, open_home, parse_store_url


@contextlib.asynccontextmanager
async def opened(home: Home, *, read_only: bool) -> AsyncIterator[HomeStores]:
    """The stores of `home`, closed on exit: any home with an event log, whether `upulse
    init` laid it out or an embedded engine wrote it (NotAHome for a folder with neither
    config.json nor events.db).

    `read_only` opens nothing for writing: no writer thread, no schema change, no lock, so a
    query never waits for a running daemon or changes a file.
    """
    cfg = config_file.load_or_default(home.readable().config)
    stores = await open_home(home.root, store=cfg.store, read_only=read_only)
    try:
        yield stores
    finally:
        await stores.close()


def log_file(home: Home, cfg: config_file.Config) -> Path:
    """The file of `home`'s event log: config.json's store URL, else the layout's own."""
    return parse_store_url(cfg.store or home.layout.store_url())[1]
