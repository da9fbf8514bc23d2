"""ChatRenderer: prompt rendering, observation deltas and the append-only check, with the real SmolLM2
tokenizer."""

from __future__ import annotations

import pytest

from agentrl.chat import ChatRenderer
from agentrl.errors import ConfigError, TemplateError
from agentrl.types import Message, TokenSource

IM_START, IM_END, ENDOFTEXT, NL = 1, 2, 0, 198


def _conv():
    return [Message("system", "Be brief."), Message("user", "What is 2+2? ünïcode ✓")]


def test_render_text_matches_apply_chat_template(tok, renderer):
    convos = [
        _conv(),
        [Message("user", "hi")],
        [*_conv(), Message("assistant", "4"), Message("user", "sure?")],
    ]
    for msgs in convos:
        for gen in (True, False):
            want = tok.apply_chat_template(
                [m.to_dict() for m in msgs], tokenize=False, add_generation_prompt=gen
            )
            assert renderer.render_text(msgs, add_generation_prompt=gen) == want


def test_stop_ids_of_smollm2(renderer):
    assert renderer.stop_token_ids == (IM_END, ENDOFTEXT)
    assert renderer.eos_token_id == IM_END
    with pytest.raises(ConfigError, match="not in the vocabulary"):
        ChatRenderer(renderer.tokenizer, stop_token_ids=[10**6])


def test_prompt_pieces_one_per_message(renderer, tok):
    p = renderer.render_prompt(_conv())
    assert list(p.token_ids) == tok.apply_chat_template(
        [m.to_dict() for m in _conv()], tokenize=True, add_generation_prompt=True, return_dict=False
    )
    assert [(x.source, x.message_index) for x in p.pieces] == [
        (TokenSource.PROMPT, 0),
        (TokenSource.PROMPT, 1),
        (TokenSource.PROMPT, None),
    ]
    assert renderer.decode(p.pieces[2].token_ids) == "<|im_start|>assistant\n"
    assert sum(len(x.token_ids) for x in p.pieces) == len(p.token_ids)


def test_separator_after_end_of_turn_is_template(renderer):
    """Pitfall §15.3: ChatML's "\\n" after <|im_end|> is never sampled; it is a TEMPLATE piece."""
    msgs = _conv()
    p = renderer.render_prompt(msgs)
    sampled = [*renderer.encode("It is 4."), IM_END]
    d = renderer.render_delta(
        msgs, p.token_ids, p.text, sampled, [Message("user", "Sure?")], turn=0, first_message_index=3
    )
    kinds = [(x.source, x.message_index, renderer.decode(x.token_ids)) for x in d.pieces]
    assert kinds == [
        (TokenSource.TEMPLATE, None, "\n"),
        (TokenSource.OBSERVATION, 3, "<|im_start|>user\nSure?<|im_end|>\n"),
        (TokenSource.TEMPLATE, None, "<|im_start|>assistant\n"),
    ]
    assert d.pieces[0].token_ids == (NL,)
    # The delta continues the stream exactly: prefix + sampled + delta == one-pass render, in tokens too.
    full = [*msgs, Message("assistant", "It is 4."), Message("user", "Sure?")]
    one_pass = renderer.encode(renderer.render_text(full, add_generation_prompt=True))
    assert [*p.token_ids, *sampled, *d.token_ids] == one_pass
    assert d.text == renderer.decode(one_pass)


def test_several_new_messages_get_their_own_pieces(renderer):
    msgs = [Message("user", "go")]
    p = renderer.render_prompt(msgs)
    new = [Message("user", "first"), Message("user", "second")]
    d = renderer.render_delta(
        msgs, p.token_ids, p.text, [*renderer.encode("ok"), IM_END], new, turn=0, first_message_index=2
    )
    obs = [x for x in d.pieces if x.source is TokenSource.OBSERVATION]
    assert [x.message_index for x in obs] == [2, 3]
    assert "first" in renderer.decode(obs[0].token_ids) and "second" in renderer.decode(obs[1].token_ids)


def test_turn_without_stop_token_gets_template_closing(renderer):
    """When the model did not sample <|im_end|>, the template's closing is TEMPLATE (mask 0)."""
    msgs = [Message("user", "go")]
    p = renderer.render_prompt(msgs)
    d = renderer.render_delta(
        msgs,
        p.token_ids,
        p.text,
        renderer.encode("partial"),
        [Message("user", "x")],
        turn=0,
        first_message_index=2,
    )
    assert d.pieces[0].source is TokenSource.TEMPLATE
    assert renderer.decode(d.pieces[0].token_ids) == "<|im_end|>\n"


def test_sampled_eos_other_than_end_of_turn_is_kept(renderer):
    """The model may stop on <|endoftext|>; it stays as sampled and the template's <|im_end|>\\n follows."""
    msgs = [Message("user", "go")]
    p = renderer.render_prompt(msgs)
    sampled = [*renderer.encode("done"), ENDOFTEXT]
    d = renderer.render_delta(
        msgs, p.token_ids, p.text, sampled, [Message("user", "x")], turn=0, first_message_index=2
    )
    assert renderer.decode(d.pieces[0].token_ids) == "<|im_end|>\n"
    assert d.text.endswith(
        "done<|endoftext|><|im_end|>\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
    )


# Pitfall §15.4: templates that are not append-only. This one drops reasoning from earlier assistant
# turns, as Qwen3's does.
DROP_THINKING = (
    "{% for m in messages %}"
    "{% set c = m['content'] %}"
    "{% if m['role'] == 'assistant' and not loop.last %}{% set c = c.split('</think>')[-1] %}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + c + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_template_dropping_earlier_reasoning_is_detected(tok):
    r = ChatRenderer(tok, chat_template=DROP_THINKING)
    msgs = [Message("user", "go")]
    p = r.render_prompt(msgs)
    sampled = [*r.encode("<think>hmm</think>42"), IM_END]
    # Once a new message follows, turn 0 renders without its reasoning: not what the model sampled.
    with pytest.raises(TemplateError, match="rewrites the model's turn 0"):
        r.render_delta(
            msgs, p.token_ids, p.text, sampled, [Message("user", "more")], turn=0, first_message_index=2
        )


# A template that keeps only the last three messages (a crude context window).
LAST_THREE = (
    "{% for m in messages[-3:] %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def test_template_dropping_earlier_messages_is_detected(tok):
    r = ChatRenderer(tok, chat_template=LAST_THREE)
    msgs = [Message("user", "go")]
    p = r.render_prompt(msgs)
    s0 = [*r.encode("a"), IM_END]
    d = r.render_delta(msgs, p.token_ids, p.text, s0, [Message("user", "b")], turn=0, first_message_index=2)
    hist = [*msgs, Message("assistant", "a"), Message("user", "b")]
    prefix = [*p.token_ids, *s0, *d.token_ids]
    with pytest.raises(TemplateError, match="not append-only after turn 1"):
        r.render_delta(
            hist,
            prefix,
            d.text,
            [*r.encode("c"), IM_END],
            [Message("user", "d")],
            turn=1,
            first_message_index=4,
        )


def test_template_that_rewrites_the_model_turn_is_detected(tok):
    trims = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] | trim + "
        "'<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
        "{% endif %}"
    )
    r = ChatRenderer(tok, chat_template=trims)
    msgs = [Message("user", "go")]
    p = r.render_prompt(msgs)
    with pytest.raises(TemplateError, match="rewrites the model's turn"):
        r.render_delta(
            msgs,
            p.token_ids,
            p.text,
            [*r.encode("  42  "), IM_END],
            [Message("user", "x")],
            turn=0,
            first_message_index=2,
        )


def test_bpe_merge_across_the_boundary_is_detected(tok):
    """Token-level check: a template whose observation text glues onto the sampled text ("!" + "!!")."""
    glue = (
        "{% for m in messages %}{% if m['role'] == 'assistant' %}{{ 'A:' + m['content'] + '!!' }}"
        "{% else %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endif %}"
        "{% endfor %}{% if add_generation_prompt %}{{ 'A:' }}{% endif %}"
    )
    r = ChatRenderer(tok, chat_template=glue)
    assert r.encode("!!!") != r.encode("!") + r.encode("!!")  # precondition: BPE merges here
    msgs = [Message("user", "go")]
    p = r.render_prompt(msgs)
    with pytest.raises(TemplateError, match="tokenizes differently in context"):
        # Sampled "a!" without a stop token; the template closes the turn with "!!" right after it.
        r.render_delta(msgs, p.token_ids, p.text, r.encode("a!"), [], turn=0, first_message_index=2)


def test_missing_template_is_a_config_error(tok):
    class NoTemplate:
        chat_template = None

    with pytest.raises(ConfigError, match="no chat template"):
        ChatRenderer(NoTemplate())
