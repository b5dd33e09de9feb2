"""`upulse ui`: where the home's web UI is, and the token that opens it."""

from __future__ import annotations

from pulse_adapters.web import LAYER, read_token, served_address
from pulse_cli import config as config_file
from pulse_cli.home import CliError, Home
from pulse_cli.output import print_json


def ui(home: Home, *, as_json: bool) -> int:
    """Print the address the daemon's web UI listens on, with its token (and the address
    that opens it in a browser); CliError says what to do when it does not serve."""
    home.require()
    cfg = config_file.load(home.config)
    token = read_token(home.root)
    url = served_address(home.root)
    if url is None:
        if LAYER not in cfg.layers:
            raise CliError(f"the web UI is off in {home.config}: add \"{LAYER}\": {{}} under "
                           "\"layers\" (it serves on 127.0.0.1:8421 by default), then "
                           "`upulse daemon restart`")
        if home.running_pid() is None:
            raise CliError(f"the daemon of {home.root} is not running: `upulse daemon start` "
                           "serves the web UI")
        raise CliError("the daemon runs but its web UI is not listening: `upulse daemon "
                       "status` and `upulse daemon logs` say why (a port in use, say)")
    opener = f"{url}?token={token}"
    if as_json:
        print_json({"url": url, "token": token, "open": opener})
        return 0
    print(f"web UI:  {url}\ntoken:   {token}\nopen:    {opener}")
    return 0
