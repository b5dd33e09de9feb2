"""`upulse init`: a home laid out (config.json, stores, objects/, the UI's token, the engine
directory), its log and side store checked first when they are on servers."""

from __future__ import annotations

import asyncio
import json

from pulse_cli import config as config_file
from pulse_cli.home import (
    CliError,
    Home,
    UsageError,
)
from pulse_cli.output import (
    print_json,
    printable,
    without_passwords,
)
from pulse_cli.stores import (
    PROBE_NAMESPACE,
    LogUnavailable,
    log_file,
    open_stores,
    served_log,
    served_side_store,
    shown,
    store_url,
    unavailable,
)
from pulse_core import (
    PulseError,
    StoreError,
    check_host,
    private_folder,
)
from pulse_core.store import open_event_store, open_side_store


async def initialise(home: Home, instance: str, *, store: str | None = None,
                     side_store: str | None = None, host: str | None = None,
                     as_json: bool = False) -> int:
    """Lay out `home` (config, stores, objects/, engine directory); what exists is kept as is.
    `store` and `side_store` go into a new config.json (a PostgreSQL log, a Redis side
    store); each is checked first (reachable, the log's schema created), so nothing is laid
    out for a URL that does not work. `host` goes there too (None: a name no other home has,
    pulse_cli.config.new_host_name); a bad one is a UsageError before anything is made.
    Prints what was created (with `as_json`: the home, the instance, its host name and the
    created names)."""
    from pulse_adapters.web import TOKEN_FILE, ensure_token, token_path
    from pulse_cli.enginedir import init_engine_dir  # git and the template: only for init

    created: list[str] = []
    if host is not None:
        _check_host_option(host)
    if home.config.exists():
        cfg = config_file.load(home.config)
        _keeps(home, cfg, store=store, side_store=side_store, host=host)
    else:
        cfg = config_file.parse_config(
            config_file.default_config_text(instance, store=store, side_store=side_store,
                                            host=host or config_file.new_host_name()
                                            ).encode(), str(home.config))
        await check_servers(home, cfg)
        private_folder(home.root)
        config_file.write_default(home.config, instance, store=store, side_store=side_store,
                                  host=cfg.host)
        created.append(home.config.name)
    layout = home.layout
    log = log_file(home, cfg)
    side = layout.side_db if cfg.side_store is None else None
    stores = {path: slash for path, slash in (
        (log, ""), (layout.vitals_db, ""), (side, ""), (layout.objects, "/"),
        (layout.checkpoints, "/"), (layout.logs, "/")) if path is not None}
    missing = [f"{path.name}{slash}" for path, slash in stores.items() if not path.exists()]
    if missing or log is None:  # open_home creates what is missing, keeps what exists
        await (await open_stores(home, cfg.store, side_store=cfg.side_store,
                                 read_only=False)).close()
        created += missing
    if not token_path(home.root).exists():  # the web UI's token, whether or not it is on
        ensure_token(home.root)
        created.append(TOKEN_FILE)
    engine_dir = await asyncio.to_thread(init_engine_dir, home.root)
    if engine_dir:
        created += ["engine/", "staging/"]
    if as_json:
        print_json({"home": str(home.root), "instance": cfg.instance,
                    "host": config_file.home_host(home.root, cfg), "created": created})
        return 0
    where = shown(store_url(home, cfg))
    log_line = "" if log is not None else f"; the event log is at {where}"
    if created:
        shown_names = [*created[:-2], "engine/ (git, branch main) and staging/ (worktree, "
                       "branch staging)"] if engine_dir else created
        print(printable(f"initialised {home.root}: created {', '.join(shown_names)}{log_line}"))
    else:
        print(printable(f"{home.root} already exists; nothing changed{log_line}"))
    return 0


class BadHostName(UsageError):
    """`upulse init --host` names something that cannot be a host name."""


def _check_host_option(host: str) -> None:
    """BadHostName unless `host` can be config.json's host."""
    try:
        check_host(host)
    except PulseError:
        raise BadHostName(
            f"--host {json.dumps(host)}: a host name is 1-255 printable characters without "
            "spaces, and one per home that shares a log — give another, or leave --host out "
            "for this machine's hostname with a random suffix") from None


def _keeps(home: Home, cfg: config_file.Config, *, store: str | None,
           side_store: str | None, host: str | None = None) -> None:
    """UsageError when --store, --side-store or --host asks for another value than the
    existing config.json names: init never changes a home's settings."""
    for option, given, kept in (("--store", store, cfg.store),
                                ("--side-store", side_store, cfg.side_store),
                                ("--host", host, cfg.host)):
        if given is not None and given != kept:
            if option == "--host":
                now = json.dumps(kept) if kept else "null (a name kept in host.id)"
            else:
                now = shown(kept) if kept else "the home's own file (null)"
            move = (" `upulse migrate --to URL --switch` moves the event log"
                    if option == "--store" else "")
            raise UsageError(f"{home.config} exists and names {option.lstrip('-')} {now}; init "
                             f"never changes an existing home's settings — edit config.json"
                             f"{',' if move else ''}{move}")


async def check_servers(home: Home, cfg: config_file.Config) -> None:
    """Raise LogUnavailable (CliError for the side store) unless the event log and the side
    store `cfg` names on a server can be used: reached, and the log's schema created (a
    SQLite file is checked when the home is laid out)."""
    log, side_url = served_log(cfg), served_side_store(cfg)
    if log is not None:
        try:
            events = await open_event_store(log)
        except StoreError as exc:
            raise LogUnavailable(unavailable(log, exc)) from None
        await events.close()
    if side_url is not None:
        try:
            side = await open_side_store(side_url)
            try:
                await side.get_all(PROBE_NAMESPACE)
            finally:
                await side.close()
        except StoreError as exc:
            raise CliError(f"the side store at {shown(side_url)}: "
                           f"{' '.join(without_passwords(str(exc)).split())}") from None
