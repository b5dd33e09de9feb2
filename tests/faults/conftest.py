"""Fault suite: each test reproduces one fault from the hardening pass and pins its fix."""
