"""Fixtures every suite may use."""

from __future__ import annotations

import pytest

from tests.support.llm_server import ScriptedLLMServer


@pytest.fixture
def llm():
    """The model: a real OpenAI/Anthropic-protocol HTTP server replaying what the test adds."""
    with ScriptedLLMServer() as server:
        yield server
