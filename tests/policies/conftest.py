"""Fixtures for the policy tests: a tiny random model over the real SmolLM2 tokenizer (``tok`` and
``renderer`` come from tests/conftest.py)."""

from __future__ import annotations

import pytest

from agentrl.models import tiny_model

from .policy_helpers import stop_biased


@pytest.fixture(scope="session")
def model(tok, renderer):
    """A 3.2 M-parameter random Llama over SmolLM2's vocabulary that ends turns after ~8 tokens."""
    return stop_biased(tiny_model(tok, seed=0), renderer.stop_token_ids[:1], bias=8.5)
