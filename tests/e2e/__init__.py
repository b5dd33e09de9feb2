"""Whole-process tests: real child processes on real SQLite files."""
