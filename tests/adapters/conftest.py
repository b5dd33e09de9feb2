"""Fixtures of the adapter tests: a scripted chat-completions server on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pulse_adapters.llm.stand_in import ChatServer


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    """A started ChatServer with an empty script, stopped after the test."""
    with ChatServer() as server:
        yield server
