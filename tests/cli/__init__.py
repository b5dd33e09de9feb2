"""Tests of pulse_cli: engine directories, the promote gate, rollback, the loader."""
