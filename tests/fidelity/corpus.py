"""The chat-template delta corpus: real templates, conversations that stress them, and the comparison of
the token stream agentrl trains on (ChatRenderer, turn by turn) with a deployment's one-pass render.

For every template and conversation:

1. The *sampled* text of each assistant turn is what the template itself writes for that message when it
   is the newest one (rendered after the generation prompt, up to the end-of-turn marker): a model trained
   on the template writes exactly this, so any later difference comes from the template, not the model.
2. *Stream*: :class:`~agentrl.chat.ChatRenderer` renders the conversation turn by turn the way the rollout
   does (assistant turns as their sampled text, ``render_prompt`` then ``render_delta`` per turn). It raises
   :class:`~agentrl.errors.TemplateError` where the template is not append-only: a *detected* difference.
3. *Whole*: ``tokenizer.apply_chat_template`` renders the structured conversation (content, ``tool_calls``,
   reasoning fields) in one pass, as an OpenAI-compatible server or an SFT pipeline would.

The stream up to the end of the last sampled turn must be a prefix of the whole; where it is not, the first
difference is classified (:func:`classify`).
"""

from __future__ import annotations

import copy
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl.chat import ChatRenderer
from agentrl.errors import TemplateError
from agentrl.types import Message, ToolCall

TEMPLATES_DIR = Path(__file__).parent / "fixtures" / "templates"


@dataclass(frozen=True)
class Family:
    """A template and what it needs: its file, the special tokens it names, the field it reads reasoning
    from (None: it has none; ``"</think> in content"``: before ``</think>`` in the content) and the markers
    that end an assistant turn; ``kwargs`` are template variables (thinking mode, a fixed date)."""

    name: str
    file: str
    tokens: dict[str, str]
    reasoning_field: str | None
    turn_ends: tuple[str, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()


FAMILIES = (
    Family("qwen2.5", "Qwen-Qwen2.5-7B-Instruct.jinja", {}, None, ("<|im_end|>",)),
    Family("qwen3", "Qwen-Qwen3-0.6B.jinja", {}, "reasoning_content", ("<|im_end|>",)),
    Family(
        "llama3.1",
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
        None,
        ("<|eot_id|>", "<|eom_id|>"),
        (("date_string", "26 Jul 2024"),),
    ),
    Family(
        "mistral-nemo",
        "mistralai-Mistral-Nemo-Instruct-2407.jinja",
        {"bos_token": "<s>", "eos_token": "</s>"},
        None,
        ("</s>",),
    ),
    Family(
        "deepseek-v3.1",
        "deepseek-ai-DeepSeek-V3.1.jinja",
        {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
        None,
        ("<｜end▁of▁sentence｜>",),
    ),
    Family(
        "deepseek-v3.1 thinking",
        "deepseek-ai-DeepSeek-V3.1.jinja",
        {"bos_token": "<｜begin▁of▁sentence｜>", "eos_token": "<｜end▁of▁sentence｜>"},
        "</think> in content",
        ("<｜end▁of▁sentence｜>",),
        (("thinking", True),),
    ),
    Family("gpt-oss", "openai-gpt-oss-120b.jinja", {}, "thinking", ("<|end|>", "<|call|>", "<|return|>")),
    Family("smollm2", "HuggingFaceTB-SmolLM2-135M-Instruct.jinja", {}, None, ("<|im_end|>",)),
)


def template(f: Family) -> str:
    """The template's text."""
    return (TEMPLATES_DIR / f.file).read_text()


# --- conversations -----------------------------------------------------------------------------------
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "description": "Current time in a time zone.",
        "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]},
    },
}
TOOLS = [WEATHER, TIME]
LONG = "\n".join(f"row {i}: temperature {i % 37} °C, wind {i % 11} km/h — Zürich/東京" for i in range(240))


def _call(call_id: str, name: str, **args: Any) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _assistant(content: str = "", calls: list[dict[str, Any]] | None = None, reasoning: str | None = None):
    m: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        m["tool_calls"] = calls
    if reasoning is not None:
        m["reasoning"] = reasoning  # moved to the family's own field (or dropped) by :func:`for_family`
    return m


def _tool(call_id: str, name: str, content: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}


SYSTEM = {"role": "system", "content": "You are a concise assistant. Use the tools when they help."}
CONVERSATIONS: dict[str, list[dict[str, Any]]] = {
    "single call": [
        SYSTEM,
        {"role": "user", "content": "Weather in Paris?"},
        _assistant(calls=[_call("call00001", "get_weather", city="Paris")]),
        _tool("call00001", "get_weather", "12 °C, cloudy"),
        _assistant("It is 12 °C and cloudy in Paris."),
    ],
    "parallel calls, consecutive results": [
        SYSTEM,
        {"role": "user", "content": "Weather and time in Tokyo?"},
        _assistant(
            calls=[
                _call("call00002", "get_weather", city="Tokyo"),
                _call("call00003", "get_time", tz="Asia/Tokyo"),
            ]
        ),
        _tool("call00002", "get_weather", "21 °C, clear"),
        _tool("call00003", "get_time", "14:05"),
        _assistant("21 °C and clear; it is 14:05 in Tokyo."),
    ],
    "reasoning blocks": [
        SYSTEM,
        {"role": "user", "content": "Should I take an umbrella in Oslo?"},
        _assistant(
            calls=[_call("call00004", "get_weather", city="Oslo")], reasoning="I need Oslo's weather."
        ),
        _tool("call00004", "get_weather", "8 °C, rain"),
        _assistant("Yes: it is raining in Oslo.", reasoning="Rain means an umbrella."),
    ],
    "second question after reasoning": [
        {"role": "user", "content": "What is 17 * 3?"},
        _assistant("51.", reasoning="17 * 3 = 51."),
        {"role": "user", "content": "And 51 + 9?"},
        _assistant("60.", reasoning="51 + 9 = 60."),
    ],
    "long observation, no system prompt": [
        {"role": "user", "content": "Summarise the weather log of Bern."},
        _assistant(calls=[_call("call00005", "get_weather", city="Bern")]),
        _tool("call00005", "get_weather", LONG),
        _assistant("Temperatures cycle between 0 and 36 °C."),
    ],
    "two rounds of calls": [
        SYSTEM,
        {"role": "user", "content": "Compare Rome and Lima."},
        _assistant(calls=[_call("call00006", "get_weather", city="Rome")], reasoning="Rome first."),
        _tool("call00006", "get_weather", "25 °C"),
        _assistant(calls=[_call("call00007", "get_weather", city="Lima")], reasoning="Now Lima."),
        _tool("call00007", "get_weather", "18 °C"),
        _assistant("Rome is 7 °C warmer than Lima.", reasoning="25 - 18 = 7."),
    ],
}


def for_family(f: Family, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The conversation as the family's template reads it: reasoning in its field (or dropped)."""
    out = copy.deepcopy(messages)
    for m in out:
        reasoning = m.pop("reasoning", None)
        if reasoning is not None and f.reasoning_field == "</think> in content":  # DeepSeek's thinking mode
            m["content"] = f"{reasoning}</think>{m['content']}"
        elif reasoning is not None and f.reasoning_field is not None:
            m[f.reasoning_field] = reasoning
        if f.name == "gpt-oss" and m.get("tool_calls") and f.reasoning_field in m and m["content"]:
            m["content"] = ""  # gpt-oss refuses content and thinking together on a call
    return out


# --- rendering ---------------------------------------------------------------------------------------
@functools.cache
def tokenizer() -> Any:
    """SmolLM2's tokenizer (the one bundled offline); each family's template is swapped in. The
    comparison is at text level: the other families' control tokens are plain text to this vocabulary."""
    from agentrl.models import smollm2_tokenizer

    return smollm2_tokenizer()


def whole(f: Family, messages: list[dict[str, Any]], *, add_generation_prompt: bool = False) -> str:
    """One-pass render with transformers' ``apply_chat_template`` (as a deployment would)."""
    tok = tokenizer()
    return str(
        tok.apply_chat_template(
            messages,
            tools=TOOLS,
            chat_template=template(f),
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **f.tokens,
            **dict(f.kwargs),
        )
    )


def sampled_text(f: Family, messages: list[dict[str, Any]], i: int) -> str | None:
    """What a model trained on the template writes for assistant message ``i``: the template's render of it
    as the newest message, after the generation prompt, up to the end-of-turn marker. None when the
    template's generation prompt is not where it renders the turn (nothing to take)."""
    prompt = whole(f, messages[:i], add_generation_prompt=True)
    done = whole(f, messages[: i + 1])
    if not done.startswith(prompt):
        return None  # the prompt itself changes once the turn is added: not append-only
    rest = done[len(prompt) :]
    cut = min((rest.find(e) for e in f.turn_ends if e in rest), default=len(rest))
    text = rest[:cut]
    content = str(messages[i].get("content") or "")
    if f.reasoning_field == "</think> in content" and "</think>" in content and text.startswith("</think>"):
        # DeepSeek's template drops the reasoning even from the newest turn; the model still writes it
        # after the prompt's <think>.
        text = content.split("</think>", 1)[0] + text
    return text


def _message(d: dict[str, Any]) -> Message:
    calls = tuple(
        ToolCall(c["id"], c["function"]["name"], json.dumps(c["function"]["arguments"]))
        for c in d.get("tool_calls", ())
    )
    return Message(d["role"], d.get("content") or "", calls, d.get("tool_call_id"), d.get("name"))


@dataclass(frozen=True)
class Result:
    """One template x conversation: how many model turns, and how the stream and the whole compare."""

    turns: int
    outcome: str
    """``same``, ``detected: <why>`` (ChatRenderer raised) or ``silent: <class>`` (see :func:`classify`)."""
    detail: str = ""


def stream(f: Family, messages: list[dict[str, Any]]) -> tuple[str, int]:
    """The rollout's token stream through the last assistant turn, as text, and the number of model turns.
    Raises TemplateError where ChatRenderer detects that the template is not append-only."""
    tok = tokenizer()
    renderer = ChatRenderer(
        tok,
        chat_template=template(f),
        template_kwargs={**f.tokens, **dict(f.kwargs)},
        stop_token_ids=[tok.eos_token_id],
        check_tokens=False,  # text level: these templates' control tokens are not in SmolLM2's vocabulary
    )
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    history = [_message(m) for m in messages[:first]]
    prompt = renderer.render_prompt(history, tools=TOOLS)
    ids, text = list(prompt.token_ids), prompt.text
    turns = 0
    i = first
    while i < len(messages):
        sampled = sampled_text(f, messages, i)
        if sampled is None:
            raise TemplateError(
                f"chat template is not append-only at turn {turns}: adding the turn changes the prompt"
            )
        turns += 1
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        new = [_message(m) for m in messages[i + 1 : j]]
        sampled_ids = renderer.encode(sampled)
        if not new:  # the last turn: the episode ends with it
            return text + sampled, turns
        delta = renderer.render_delta(
            history, ids, text, sampled_ids, new, turn=turns - 1, first_message_index=i + 1, tools=TOOLS
        )
        history = [*history, Message("assistant", delta.assistant_text), *new]
        ids, text = [*ids, *sampled_ids, *delta.token_ids], delta.text
        i = j
    return text, turns


def classify(f: Family, messages: list[dict[str, Any]], seen: str, deployed: str) -> str:
    """Name the first difference between the stream (``seen``) and the one-pass render (``deployed``)."""
    reasoning = [m["reasoning"] for m in messages if m.get("reasoning")]
    if any(r in seen and r not in deployed for r in reasoning):
        return "reasoning stripped from history"
    if any(r not in seen and r in deployed for r in reasoning):
        return "reasoning shown only in the deployment render"
    return "other"


def run(f: Family, name: str) -> Result:
    """Compare the stream with the whole for conversation ``name``."""
    messages = for_family(f, CONVERSATIONS[name])
    n = sum(m["role"] == "assistant" for m in messages)
    try:
        deployed = whole(f, messages)
    except Exception as e:  # the template raises on the conversation itself (jinja raise_exception)
        return Result(n, "impossible: the template refuses the conversation", str(e)[:300])
    try:
        seen, n = stream(f, messages)
    except TemplateError as e:
        return Result(n, "detected: " + _why(str(e)), str(e)[:300])
    if deployed.startswith(seen):
        return Result(n, "same")
    k = next(
        (i for i, (a, b) in enumerate(zip(seen, deployed, strict=False)) if a != b),
        min(len(seen), len(deployed)),
    )
    lo, hi = max(0, k - 30), k + 40
    detail = f"at char {k}: stream {seen[lo:hi]!r} vs whole {deployed[lo:hi]!r}"
    return Result(n, "silent: " + classify(f, CONVERSATIONS[name], seen, deployed), detail)


def _why(message: str) -> str:
    for key, label in (
        ("not append-only", "not append-only"),
        ("rewrites the model's turn", "rewrites the sampled turn"),
        ("failed to render", "template refuses the sampled text as content"),
        ("does not decode", "delta does not decode to the one-pass render"),
    ):
        if key in message:
            return label
    return "other"
