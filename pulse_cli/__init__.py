"""pulse_cli: the `upulse` command — engine directories, promote and rollback, the daemon."""
