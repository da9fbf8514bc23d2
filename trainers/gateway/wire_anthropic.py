"""The Anthropic Messages API wire format (``POST /v1/messages``), translated to the chat-completions turn.

``system`` becomes the system message; a user message's ``text`` blocks a user message and each of its
``tool_result`` blocks a ``tool`` message (``tool_use_id`` is the call id); an assistant message's ``text``
and ``tool_use`` blocks one assistant message with tool calls (``input`` as JSON arguments). The result is
the same :class:`~agentrl.trainers.gateway.wire.ChatRequest` a chat-completions request becomes, recorded on
the one recording path. Answers are ``message`` objects (``stop_reason`` ``end_turn``, ``tool_use`` or
``max_tokens``) or the ``message_start`` … ``message_stop`` event stream; errors have Anthropic's shape
``{"type": "error", "error": {"type", "message"}}``, which the ``anthropic`` client parses.

What cannot be honoured is refused with a 400 naming the field: images and documents, extended thinking,
``top_k``, ``stop_sequences``, a forced ``tool_choice`` (``any``/``tool``), server tools (``bash_…``,
``web_search_…``). ``cache_control`` marks are accepted (a caching hint that changes nothing sampled).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

from agentrl.types import Message

from .wire import ChatRequest, GatewayError, WireCall, WireMessage, _int, _number, _tools

__all__ = [
    "MESSAGES_API",
    "anthropic_error",
    "message_body",
    "message_events",
    "models_body",
    "parse_messages_request",
]

MESSAGES_API = "anthropic.messages"
"""The API name of ``/v1/messages`` requests (a session speaks one API)."""

_STOP = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
}


def anthropic_error(e: GatewayError) -> dict[str, Any]:
    """``{"type": "error", "error": {"type", "message"}}``: Anthropic's error body for ``e``."""
    kind = _ERROR_TYPES.get(e.status, "api_error")
    where = f" (field: {e.param})" if e.param else ""
    return {"type": "error", "error": {"type": kind, "message": f"{e.message}{where}"}}


def _bad(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param)


def parse_messages_request(body: Any, *, count_only: bool = False) -> ChatRequest:
    """Validate a Messages body; raise :class:`GatewayError` (400) naming the first bad field.

    With ``count_only`` (``/v1/messages/count_tokens``) ``max_tokens`` is not required.
    """
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a non-empty string", "model")
    max_tokens = _int(body, "max_tokens")
    if max_tokens is None and not count_only:
        raise _bad("'max_tokens' is required (an integer >= 1)", "max_tokens")
    _refuse_unsupported(body)
    messages = [*_system(body.get("system"))]
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' is required and must be a non-empty array of messages", "messages")
    for i, m in enumerate(raw):
        messages.extend(_message(m, f"messages[{i}]"))
    tools, tools_key = _tools(_chat_tools(body.get("tools")) or None)
    temperature = _number(body, "temperature", low=0.0, high=1.0)
    if temperature is not None and temperature <= 0:
        raise _bad("temperature must be > 0: the gateway records what the policy samples", "temperature")
    top_p = _number(body, "top_p", low=0.0, high=1.0)
    if top_p is not None and top_p <= 0:
        raise _bad("top_p must be in (0, 1]", "top_p")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream")
    return ChatRequest(
        model=model,
        messages=tuple(messages),
        tools=tools,
        tools_key=tools_key,
        tool_choice=_tool_choice(body.get("tool_choice")),
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        stream=stream,
    )


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    if body.get("top_k") is not None:
        raise _bad("'top_k' is not supported: it would change the sampled distribution", "top_k")
    if body.get("stop_sequences"):
        raise _bad(
            "'stop_sequences' are not supported: the policy stops only at the chat template's end-of-turn "
            "token, and cutting its tokens afterwards would record tokens the model did not stop on",
            "stop_sequences",
        )
    thinking = body.get("thinking")
    if thinking is not None and not (isinstance(thinking, dict) and thinking.get("type") == "disabled"):
        raise _bad(
            "extended 'thinking' is not supported: the policy has no separate thinking budget (for Claude "
            "Code set MAX_THINKING_TOKENS=0)",
            "thinking",
        )
    config = body.get("output_config")
    # effort is accepted without effect (the policy has no effort setting); a format is constrained decoding
    if config is not None and (not isinstance(config, dict) or set(config) - {"effort"}):
        raise _bad("output_config: only 'effort' is accepted (no structured outputs)", "output_config")
    for key in ("mcp_servers", "container"):
        if body.get(key):
            raise _bad(f"'{key}' is not supported: the agent runs its tools", key)


def _tool_choice(v: Any) -> Any:
    if v is None:
        return "auto"
    kind = v.get("type") if isinstance(v, dict) else None
    if isinstance(v, dict) and v.get("disable_parallel_tool_use"):
        raise _bad(
            "disable_parallel_tool_use cannot be enforced: the policy may write several calls in a turn",
            "tool_choice.disable_parallel_tool_use",
        )
    if kind in ("auto", "none"):
        return kind
    raise _bad(
        f"tool_choice {v!r} is not supported: the policy samples freely, so the gateway cannot force a tool "
        "call; use {'type': 'auto'} or {'type': 'none'}",
        "tool_choice",
    )


def _chat_tools(v: Any) -> list[dict[str, Any]]:
    """Anthropic custom tools in the chat-completions form the session renders."""
    if v is None:
        return []
    if not isinstance(v, list):
        raise _bad("'tools' must be an array of tools", "tools")
    out = []
    for i, t in enumerate(v):
        if not isinstance(t, dict) or t.get("type", "custom") != "custom":
            kind = t.get("type") if isinstance(t, dict) else None
            raise _bad(
                f"tools[{i}]: only custom tools (name, description, input_schema) are supported, got type "
                f"{kind!r} (server tools run at Anthropic)",
                f"tools[{i}].type",
            )
        fn: dict[str, Any] = {"name": t.get("name")}
        if t.get("description") is not None:
            fn["description"] = t["description"]
        if "input_schema" not in t:
            raise _bad(f"tools[{i}].input_schema is required", f"tools[{i}].input_schema")
        fn["parameters"] = t["input_schema"]
        out.append({"type": "function", "function": fn})
    return out


def _system(v: Any) -> list[WireMessage]:
    if v is None or v == "" or v == []:
        return []
    if isinstance(v, str):
        return [WireMessage("system", v)]
    if isinstance(v, list):
        return [WireMessage("system", "\n\n".join(_text_block(b, f"system[{j}]") for j, b in enumerate(v)))]
    raise _bad("'system' must be a string or an array of text blocks", "system")


def _text_block(b: Any, where: str) -> str:
    if not (isinstance(b, dict) and b.get("type") == "text" and isinstance(b.get("text"), str)):
        kind = b.get("type") if isinstance(b, dict) else None
        raise _bad(
            f"{where}: only text blocks are supported here, got {kind!r} (images and documents are not: the "
            "policy reads text)",
            f"{where}.type",
        )
    return str(b["text"])


def _message(m: Any, where: str) -> list[WireMessage]:
    # Claude Code sends "system" messages inside the conversation too (its environment notes).
    if not isinstance(m, dict) or m.get("role") not in ("user", "assistant", "system"):
        raise _bad(f"{where}.role must be 'user', 'assistant' or 'system'", f"{where}.role")
    content = m.get("content")
    if isinstance(content, str):
        return [WireMessage(m["role"], content)]
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or an array of content blocks", f"{where}.content")
    if m["role"] == "system":
        return [
            WireMessage(
                "system", "\n\n".join(_text_block(b, f"{where}.content[{j}]") for j, b in enumerate(content))
            )
        ]
    if m["role"] == "assistant":
        texts, calls = [], []
        for j, b in enumerate(content):
            at = f"{where}.content[{j}]"
            if isinstance(b, dict) and b.get("type") == "tool_use":
                if not isinstance(b.get("id"), str) or not isinstance(b.get("name"), str):
                    raise _bad(f"{at}: a tool_use block needs 'id' and 'name' strings", at)
                calls.append(WireCall.make(b["id"], b["name"], json.dumps(b.get("input", {}))))
            else:
                texts.append(_text_block(b, at))
        return [WireMessage("assistant", "".join(texts), tuple(calls))]
    out: list[WireMessage] = []
    for j, b in enumerate(content):
        at = f"{where}.content[{j}]"
        if isinstance(b, dict) and b.get("type") == "tool_result":
            call_id = b.get("tool_use_id")
            if not isinstance(call_id, str) or not call_id:
                raise _bad(f"{at}.tool_use_id is required", f"{at}.tool_use_id")
            result = b.get("content", "")
            if isinstance(result, list):
                result = "\n".join(_text_block(r, f"{at}.content[{k}]") for k, r in enumerate(result))
            if not isinstance(result, str):
                raise _bad(f"{at}.content must be a string or text blocks", f"{at}.content")
            out.append(WireMessage("tool", result, (), call_id))
        else:
            text = _text_block(b, at)
            if out and out[-1].role == "user":  # adjacent text blocks are one user message
                out[-1] = WireMessage("user", f"{out[-1].content}\n{text}")
            else:
                out.append(WireMessage("user", text))
    return out


# -------------------------------------------------------------------------------------------------
def _blocks(message: Message) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if message.content or not message.tool_calls:
        blocks.append({"type": "text", "text": message.content})
    for c in message.tool_calls:
        try:
            args = json.loads(c.arguments)
        except ValueError:  # the parsers return only calls whose arguments parse; kept verbatim otherwise
            args = {"arguments": c.arguments}
        blocks.append({"type": "tool_use", "id": c.id, "name": c.name, "input": args})
    return blocks


def message_body(
    *, id: str, model: str, message: Message, finish_reason: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    """A ``message`` object, as the Messages API returns it."""
    return {
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": _blocks(message),
        "stop_reason": _STOP[finish_reason],
        "stop_sequence": None,
        "usage": {
            "input_tokens": prompt_tokens,
            "output_tokens": completion_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def message_events(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The same answer as the Messages stream: ``message_start``, each content block (start, one delta,
    stop), ``message_delta`` with the stop reason and usage, ``message_stop``. The policy returns a whole
    turn at once, so each delta carries a whole block."""
    usage = message["usage"]
    start = {**message, "content": [], "stop_reason": None, "usage": {**usage, "output_tokens": 0}}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    for k, b in enumerate(message["content"]):
        head: dict[str, Any]
        if b["type"] == "text":
            head, delta = {"type": "text", "text": ""}, {"type": "text_delta", "text": b["text"]}
        else:
            head = {**b, "input": {}}
            delta = {"type": "input_json_delta", "partial_json": json.dumps(b["input"])}
        events += [
            {"type": "content_block_start", "index": k, "content_block": head},
            {"type": "content_block_delta", "index": k, "delta": delta},
            {"type": "content_block_stop", "index": k},
        ]
    events += [
        {
            "type": "message_delta",
            "delta": {"stop_reason": message["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": usage["output_tokens"]},
        },
        {"type": "message_stop"},
    ]
    return events


def models_body(name: str, created: int) -> dict[str, Any]:
    """``GET /v1/models`` in Anthropic's form (a client that sends ``anthropic-version`` gets this)."""
    import datetime

    at = datetime.datetime.fromtimestamp(created, tz=datetime.UTC).isoformat().replace("+00:00", "Z")
    entry = {"type": "model", "id": name, "display_name": name, "created_at": at}
    return {"data": [entry], "has_more": False, "first_id": name, "last_id": name}


def new_id() -> str:
    """A message id."""
    return f"msg_{uuid.uuid4().hex}"
