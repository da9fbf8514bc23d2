"""The OpenAI chat-completions wire format: validated requests in, response bodies out.

A request body is checked field by field; anything the gateway cannot honour faithfully (stop strings,
logit biases, penalties, forced tool choice, several choices) is refused with a 400 that names the field,
never silently ignored. Messages are normalized (``developer`` is ``system``, a missing assistant content is
``""``, text parts are joined, tool-call arguments compare as JSON values) so that the same conversation sent
twice compares equal however the agent's framework re-serializes it.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.errors import AgentRLError
from agentrl.types import Message, ToolCall

__all__ = [
    "ChatRequest",
    "GatewayError",
    "WireCall",
    "WireMessage",
    "completion_body",
    "models_list",
    "parse_chat_request",
    "parse_finish",
    "stream_chunks",
]

_TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class GatewayError(AgentRLError):
    """A request the gateway refuses, with its HTTP status and an OpenAI-style error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        kind: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind

    def body(self) -> dict[str, Any]:
        """``{"error": {message, type, param, code}}`` as the OpenAI API answers errors."""
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _bad(message: str, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


@dataclass(frozen=True, slots=True)
class WireCall:
    """A tool call inside an assistant message, as the agent sent it."""

    id: str
    """The call id."""
    name: str
    """The function name."""
    arguments: str = field(compare=False)
    """The arguments string, verbatim (not compared: :attr:`canonical` is)."""
    canonical: str = ""
    """The arguments as canonical JSON (sorted keys), or verbatim when not JSON; equality compares this."""

    @classmethod
    def make(cls, id: str, name: str, arguments: str) -> WireCall:
        """A call whose :attr:`canonical` form is computed from ``arguments``."""
        try:
            canonical = json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
        except ValueError:
            canonical = arguments
        return cls(id, name, arguments, canonical)


@dataclass(frozen=True, slots=True)
class WireMessage:
    """One request message, normalized so that equal conversations compare equal."""

    role: str
    """``system`` (also for ``developer``), ``user``, ``assistant`` or ``tool``."""
    content: str
    """Text content (``""`` when absent; text parts joined by newlines)."""
    tool_calls: tuple[WireCall, ...] = ()
    """An assistant message's tool calls."""
    tool_call_id: str | None = None
    """A tool message's call id."""
    name: str | None = None
    """A tool (or user) message's name, if sent."""

    def to_message(self) -> Message:
        """The core :class:`~agentrl.types.Message` of this wire message."""
        return Message(
            self.role,
            self.content,
            tool_calls=tuple(ToolCall(c.id, c.name, c.arguments) for c in self.tool_calls),
            tool_call_id=self.tool_call_id,
            name=self.name,
        )

    @classmethod
    def of(cls, message: Message) -> WireMessage:
        """The normalized wire form of a message the gateway itself produced."""
        return cls(
            message.role,
            message.content,
            tuple(WireCall.make(c.id, c.name, c.arguments) for c in message.tool_calls),
            message.tool_call_id if message.role != "assistant" else None,
            message.name if message.role != "assistant" else None,
        )


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated ``POST /v1/chat/completions`` body (only what affects the answer)."""

    model: str
    """The model name the client asked for (answered with the gateway's own name)."""
    messages: tuple[WireMessage, ...]
    """The conversation, normalized."""
    tools: tuple[Mapping[str, Any], ...] = ()
    """Function tool schemas, as sent."""
    tools_key: str = ""
    """Canonical JSON of :attr:`tools` (a session's tools may not change between requests)."""
    tool_choice: Literal["auto", "none"] = "auto"
    """``auto``: tool calls in the model's text are parsed out; ``none``: the text is returned as is."""
    temperature: float | None = None
    """Sampling temperature (None: the gateway's default)."""
    top_p: float | None = None
    """Nucleus mass (None: 1.0)."""
    max_tokens: int | None = None
    """Most tokens for this turn (``max_tokens`` or ``max_completion_tokens``)."""
    seed: int | None = None
    """Sampling seed, where the policy supports one."""
    stream: bool = False
    """Answer as server-sent events."""
    include_usage: bool = False
    """``stream_options.include_usage``: end the stream with a usage chunk."""


# -------------------------------------------------------------------------------------------------
def parse_chat_request(body: Any) -> ChatRequest:
    """Validate a chat-completions body; raise :class:`GatewayError` (400) naming the first bad field."""
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a non-empty string", "model")
    raw = body.get("messages")
    if not isinstance(raw, list) or not raw:
        raise _bad("'messages' is required and must be a non-empty array of messages", "messages")
    messages = tuple(_message(m, f"messages[{i}]") for i, m in enumerate(raw))
    tools, tools_key = _tools(body.get("tools"))
    tool_choice = _tool_choice(body.get("tool_choice"))
    _refuse_unsupported(body)
    temperature = _number(body, "temperature", low=0.0, high=2.0)
    if temperature is not None and temperature <= 0:
        raise _bad(
            "temperature must be > 0: the gateway records what the policy samples (use e.g. 1.0)",
            "temperature",
        )
    top_p = _number(body, "top_p", low=0.0, high=1.0)
    if top_p is not None and top_p <= 0:
        raise _bad("top_p must be in (0, 1]", "top_p")
    max_tokens = _int(body, "max_completion_tokens")
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens")
    seed = _int(body, "seed", low=None)
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream")
    opts = body.get("stream_options") or {}
    if not isinstance(opts, dict) or not isinstance(opts.get("include_usage", False), bool):
        raise _bad("'stream_options' must be an object like {\"include_usage\": true}", "stream_options")
    return ChatRequest(
        model=model,
        messages=messages,
        tools=tools,
        tools_key=tools_key,
        tool_choice=tool_choice,
        temperature=temperature,
        top_p=top_p,
        max_tokens=max_tokens,
        seed=seed,
        stream=stream,
        include_usage=bool(opts.get("include_usage", False)),
    )


def _refuse_unsupported(body: Mapping[str, Any]) -> None:
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad("n must be 1: the gateway records one conversation per session", "n")
    if body.get("stop"):
        raise _bad(
            "'stop' sequences are not supported: the policy stops only at the chat template's end-of-turn "
            "token, and cutting its tokens afterwards would record tokens the model did not stop on",
            "stop",
        )
    if body.get("logit_bias"):
        raise _bad("'logit_bias' is not supported: it would change the sampled distribution", "logit_bias")
    for key in ("frequency_penalty", "presence_penalty"):
        if body.get(key):
            raise _bad(f"'{key}' is not supported: it would change the sampled distribution", key)
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise _bad(
            "'response_format' other than text is not supported (no constrained decoding)", "response_format"
        )
    for key in ("functions", "function_call"):
        if body.get(key) is not None:
            raise _bad(f"'{key}' is the deprecated functions API; send 'tools' instead", key)
    if body.get("logprobs") or body.get("top_logprobs"):
        raise _bad(
            "'logprobs' is not supported by the gateway (the log-probs are in the recording)", "logprobs"
        )


def _number(body: Mapping[str, Any], key: str, *, low: float, high: float) -> float | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or not low <= v <= high:
        raise _bad(f"'{key}' must be a number in [{low:g}, {high:g}], got {v!r}", key)
    return float(v)


def _int(body: Mapping[str, Any], key: str, *, low: int | None = 1) -> int | None:
    v = body.get(key)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or (low is not None and v < low):
        raise _bad(f"'{key}' must be an integer{f' >= {low}' if low is not None else ''}, got {v!r}", key)
    return v


def _content(v: Any, where: str) -> str:
    if v is None:
        return ""
    if isinstance(v, str):
        return v
    if isinstance(v, list):
        texts = []
        for j, part in enumerate(v):
            if not (
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                raise _bad(
                    f"{where}.content[{j}]: only text parts ({{'type': 'text', 'text': ...}}) are supported",
                    f"{where}.content",
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise _bad(f"{where}.content must be a string, null or an array of text parts", f"{where}.content")


def _message(m: Any, where: str) -> WireMessage:
    if not isinstance(m, dict):
        raise _bad(f"{where} must be an object with a 'role'", where)
    role = _ROLES.get(m.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise _bad(f"{where}.role must be one of {sorted(_ROLES)}, got {m.get('role')!r}", f"{where}.role")
    content = _content(m.get("content"), where)
    name = m.get("name")
    if name is not None and not isinstance(name, str):
        raise _bad(f"{where}.name must be a string", f"{where}.name")
    if role == "assistant":
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list):
            raise _bad(f"{where}.tool_calls must be an array", f"{where}.tool_calls")
        return WireMessage(
            role, content, tuple(_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls))
        )
    if m.get("tool_calls"):
        raise _bad(f"{where}: only assistant messages carry tool_calls", f"{where}.tool_calls")
    call_id = m.get("tool_call_id")
    if role == "tool":
        if not isinstance(call_id, str) or not call_id:
            raise _bad(f"{where}.tool_call_id is required for a tool message", f"{where}.tool_call_id")
        return WireMessage(role, content, (), call_id, name)
    if role == "user":
        return WireMessage(role, content, (), None, name)
    return WireMessage(role, content)


def _call(c: Any, where: str) -> WireCall:
    fn = c.get("function") if isinstance(c, dict) else None
    if not (isinstance(c, dict) and isinstance(c.get("id"), str) and isinstance(fn, dict)):
        raise _bad(
            f"{where} must be {{'id': str, 'type': 'function', 'function': {{name, arguments}}}}", where
        )
    if c.get("type", "function") != "function":
        raise _bad(f"{where}.type must be 'function'", f"{where}.type")
    name, args = fn.get("name"), fn.get("arguments")
    if not isinstance(name, str) or not isinstance(args, str):
        raise _bad(f"{where}.function needs 'name' and 'arguments' strings", f"{where}.function")
    return WireCall.make(c["id"], name, args)


def _tools(v: Any) -> tuple[tuple[Mapping[str, Any], ...], str]:
    if v is None:
        return (), ""
    if not isinstance(v, list):
        raise _bad("'tools' must be an array of function tools", "tools")
    seen: set[str] = set()
    for i, t in enumerate(v):
        where = f"tools[{i}]"
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict):
            raise _bad(f"{where} must be {{'type': 'function', 'function': {{...}}}}", where)
        name = fn.get("name")
        if not isinstance(name, str) or not _TOOL_NAME.match(name):
            raise _bad(
                f"{where}.function.name must match [A-Za-z0-9_-]{{1,64}}, got {name!r}",
                f"{where}.function.name",
            )
        if name in seen:
            raise _bad(f"{where}: a second tool named {name!r}", f"{where}.function.name")
        seen.add(name)
        if "description" in fn and not isinstance(fn["description"], str):
            raise _bad(f"{where}.function.description must be a string", f"{where}.function.description")
        if "parameters" in fn:
            _schema(fn["parameters"], f"{where}.function.parameters")
    if not v:
        return (), ""
    return tuple(v), json.dumps(v, sort_keys=True, separators=(",", ":"))


def _schema(p: Any, where: str) -> None:
    """The parts of a JSON Schema that a function's parameters must get right."""
    if not isinstance(p, dict):
        raise _bad(f"{where} must be a JSON Schema object", where)
    if p.get("type", "object") != "object":
        raise _bad(
            f"{where}.type must be 'object' (the arguments are a JSON object), got {p['type']!r}", where
        )
    props = p.get("properties", {})
    if not isinstance(props, dict) or not all(isinstance(s, dict) for s in props.values()):
        raise _bad(
            f"{where}.properties must map each argument name to a schema object", f"{where}.properties"
        )
    required = p.get("required", [])
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise _bad(f"{where}.required must be an array of argument names", f"{where}.required")
    missing = [r for r in required if r not in props]
    if missing:
        raise _bad(f"{where}.required names {missing}, which are not in its properties", f"{where}.required")


def _tool_choice(v: Any) -> Literal["auto", "none"]:
    if v is None or v == "auto":
        return "auto"
    if v == "none":
        return "none"
    raise _bad(
        f"tool_choice {v!r} is not supported: the policy samples freely, so the gateway cannot force a tool "
        "call; use 'auto' or 'none'",
        "tool_choice",
    )


def parse_finish(body: Any, *, reward_optional: bool = False) -> tuple[float | None, dict[str, Any]]:
    """Validate a ``POST /s/<id>/finish`` (or ``/reward``) body: ``{"reward": float, "info": {str: JSON
    scalar}}``. With ``reward_optional`` a body without ``reward`` (or with ``null``) gives ``None``: the
    session ends and its reward comes later."""
    if not isinstance(body, dict):
        raise _bad('the finish body must be a JSON object like {"reward": 1.0, "info": {}}')
    reward = body.get("reward")
    if reward is None and reward_optional:
        return None, _finish_info(body)
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        raise _bad(f"'reward' is required and must be a finite number, got {reward!r}", "reward")
    return float(reward), _finish_info(body)


def _finish_info(body: dict[str, Any]) -> dict[str, Any]:
    info = body.get("info") or {}
    if not isinstance(info, dict):
        raise _bad("'info' must be an object", "info")
    for k, v in info.items():
        if not (v is None or isinstance(v, str | int | float | bool)) or (
            isinstance(v, float) and not math.isfinite(v)
        ):
            raise _bad(f"info[{k!r}] must be a JSON scalar (string, number, boolean or null)", "info")
    return dict(info)


def models_list(name: str, created: int) -> dict[str, Any]:
    """The ``GET /v1/models`` body (OpenAI's form): the one model served."""
    entry = {"id": name, "object": "model", "created": created, "owned_by": "agentrl"}
    return {"object": "list", "data": [entry]}


# -------------------------------------------------------------------------------------------------
def _message_body(message: Message) -> dict[str, Any]:
    out: dict[str, Any] = {"role": "assistant", "content": message.content or None}
    if message.tool_calls:
        out["tool_calls"] = [c.to_dict() for c in message.tool_calls]
    elif out["content"] is None:
        out["content"] = ""
    return out


def completion_body(
    *,
    id: str,
    created: int,
    model: str,
    message: Message,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """A ``chat.completion`` object with one choice."""
    return {
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "choices": [
            {"index": 0, "message": _message_body(message), "finish_reason": finish_reason, "logprobs": None}
        ],
        "usage": _usage(prompt_tokens, completion_tokens),
    }


def _usage(prompt: int, completion: int) -> dict[str, int]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def stream_chunks(completion: Mapping[str, Any], *, include_usage: bool) -> Sequence[dict[str, Any]]:
    """The same answer as ``chat.completion.chunk`` events: role, content, each tool call, finish, usage.

    The policy returns a whole turn at once (token in, token out), so the stream carries it in a few chunks
    rather than token by token.
    """
    head = {k: completion[k] for k in ("id", "created", "model")}
    choice = completion["choices"][0]
    msg = choice["message"]

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            **head,
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    out = [chunk({"role": "assistant", "content": ""})]
    if msg.get("content"):
        out.append(chunk({"content": msg["content"]}))
    for i, call in enumerate(msg.get("tool_calls") or ()):
        out.append(chunk({"tool_calls": [{"index": i, **call}]}))
    out.append(chunk({}, choice["finish_reason"]))
    if include_usage:
        out.append({**head, "object": "chat.completion.chunk", "choices": [], "usage": completion["usage"]})
    return out
