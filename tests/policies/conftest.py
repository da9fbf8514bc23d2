"""Fixtures for the policy tests: the real SmolLM2 tokenizer and a tiny random model over it."""

from __future__ import annotations

import pytest

from agentrl.chat import ChatRenderer
from agentrl.models import smollm2_tokenizer, tiny_model

from .policy_helpers import stop_biased


@pytest.fixture(scope="session")
def tok():
    return smollm2_tokenizer()


@pytest.fixture(scope="session")
def renderer(tok):
    return ChatRenderer(tok)


@pytest.fixture(scope="session")
def model(tok, renderer):
    """A 3.2 M-parameter random Llama over SmolLM2's vocabulary that ends turns after ~8 tokens."""
    return stop_biased(tiny_model(tok, seed=0), renderer.stop_token_ids[:1], bias=8.5)
