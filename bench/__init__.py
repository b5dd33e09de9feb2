"""Benchmarks: each prints its figures beside the machine's own limit, measured in the same run.

Run one with `python -m bench.<name>`; see bench/README.md for the floors.
"""
