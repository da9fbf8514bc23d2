"""The OpenAI Responses API wire format (``POST /v1/responses``), translated to the chat-completions turn.

A Responses request is a list of *input items* (messages, ``function_call``, ``function_call_output``) plus
``instructions``. It becomes the same :class:`~agentrl.trainers.gateway.wire.ChatRequest` that a
chat-completions request becomes: ``instructions`` is the system message, an assistant ``message`` item and
the ``function_call`` items after it are one assistant message with tool calls (``call_id`` is the call's
id), a ``function_call_output`` is a ``tool`` message. So the session records a Responses conversation on
the one recording path, with the same prefix check and split reasons.

``previous_response_id`` continues a stored response of the same session: its conversation (without its
``instructions``, which, as on the OpenAI API, are not carried over) comes before the new input items.
Fields the gateway cannot honour (``n``-like fan-out, forced tool choice, images, built-in tools, stop
strings, reasoning summaries, background mode, server-side conversations) are refused with a 400 naming them.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from agentrl.types import Message

from .wire import ChatRequest, GatewayError, WireCall, WireMessage, _int, _number, _tool_choice, _tools

__all__ = ["RESPONSES_API", "ResponsesRequest", "parse_responses_request", "response_body", "response_events"]

RESPONSES_API = "responses"
"""The API name of ``/v1/responses`` requests (a session speaks one API)."""

_IGNORED = (
    "metadata",
    "user",
    "safety_identifier",
    "prompt_cache_key",
    "service_tier",
    "prompt_cache_retention",
)
"""Fields that do not change what is sampled: accepted (``metadata`` is echoed)."""

_REFUSED = {
    "background": "background mode is not supported: answers come on the request's own connection",
    "conversation": "server-side conversations are not supported; send the items, or previous_response_id",
    "prompt": "stored prompt templates are not supported; send the instructions and input",
    "max_tool_calls": "'max_tool_calls' cannot be enforced: the policy samples freely",
    "top_logprobs": "'top_logprobs' is not supported by the gateway (the log-probs are in the recording)",
    "stop": "'stop' sequences are not supported: the policy stops only at the template's end-of-turn token",
    "context_management": "server-side context management is not supported: the agent owns its history",
}


@dataclass(frozen=True, slots=True)
class ResponsesRequest:
    """A validated ``POST /v1/responses`` body."""

    chat: ChatRequest
    """The request as a chat-completions turn, without the conversation of ``previous_response_id``."""
    instructions: str | None
    """The system message of this request (not carried over by ``previous_response_id``)."""
    input: tuple[WireMessage, ...]
    """The new input items as messages."""
    previous_response_id: str | None
    """A stored response of the same session that this request continues."""
    store: bool
    """Keep the response so that a later request may continue it (default true, as on the API)."""
    tools: tuple[Mapping[str, Any], ...]
    """The function tools in the Responses form, as sent (echoed in the response object)."""
    metadata: Mapping[str, Any]
    """Echoed in the response object."""

    def with_history(self, history: Sequence[WireMessage]) -> ChatRequest:
        """The whole conversation: instructions, the continued response's conversation, the new input."""
        system = (WireMessage("system", self.instructions),) if self.instructions else ()
        return replace(self.chat, messages=(*system, *history, *self.input))


def _bad(message: str, param: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param)


def parse_responses_request(body: Any) -> ResponsesRequest:
    """Validate a Responses body; raise :class:`GatewayError` (400) naming the first bad field."""
    if not isinstance(body, dict):
        raise _bad(f"the request body must be a JSON object, got {type(body).__name__}")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("'model' is required and must be a non-empty string", "model")
    for key, why in _REFUSED.items():
        if body.get(key) not in (None, [], {}):
            raise _bad(why, key)
    if body.get("n") not in (None, 1):
        raise _bad("n must be 1: the gateway records one conversation per session", "n")
    include = body.get("include")
    # Encrypted reasoning of no reasoning items is nothing: the policy's text is all in the message item (a
    # template's thinking included), so this one is honoured as asked; anything else would be new output.
    if include and (not isinstance(include, list) or set(include) - {"reasoning.encrypted_content"}):
        raise _bad(
            f"'include' {include!r} is not supported (the one value accepted is reasoning.encrypted_content, "
            "which adds nothing: the policy writes no reasoning items)",
            "include",
        )
    if body.get("parallel_tool_calls") is False:
        raise _bad(
            "parallel_tool_calls false cannot be enforced: the policy may write several calls in a turn",
            "parallel_tool_calls",
        )
    if body.get("truncation") not in (None, "disabled"):
        raise _bad("truncation must be 'disabled': the agent owns its history", "truncation")
    reasoning = body.get("reasoning")
    # effort is accepted without effect (the policy has no effort setting); a summary would be new output
    if reasoning is not None and not (isinstance(reasoning, dict) and not reasoning.get("summary")):
        raise _bad(
            "'reasoning' summaries are not supported: the policy writes no reasoning items", "reasoning"
        )
    text = body.get("text")
    if text is not None:
        fmt = text.get("format") if isinstance(text, dict) else None
        if not isinstance(text, dict) or (fmt is not None and fmt.get("type") != "text"):
            raise _bad(
                "text.format other than text is not supported (no constrained decoding)", "text.format"
            )
        if text.get("verbosity") not in (None, "medium"):
            raise _bad("text.verbosity is not supported", "text.verbosity")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad("'instructions' must be a string", "instructions")
    raw = body.get("input")
    if isinstance(raw, str):
        items: tuple[WireMessage, ...] = (WireMessage("user", raw),)
    elif isinstance(raw, list) and raw:
        items = _items(raw)
    else:
        raise _bad("'input' is required: a string or a non-empty array of input items", "input")
    prev = body.get("previous_response_id")
    if prev is not None and (not isinstance(prev, str) or not prev):
        raise _bad("'previous_response_id' must be a response id", "previous_response_id")
    store = body.get("store", True)
    if not isinstance(store, bool | None):
        raise _bad("'store' must be a boolean", "store")
    tools, chat_tools = _function_tools(body.get("tools"))
    checked, tools_key = _tools(chat_tools or None)
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise _bad("'stream' must be a boolean", "stream")
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise _bad("'metadata' must be an object", "metadata")
    temperature = _number(body, "temperature", low=0.0, high=2.0)
    if temperature is not None and temperature <= 0:
        raise _bad("temperature must be > 0: the gateway records what the policy samples", "temperature")
    top_p = _number(body, "top_p", low=0.0, high=1.0)
    if top_p is not None and top_p <= 0:
        raise _bad("top_p must be in (0, 1]", "top_p")
    chat = ChatRequest(
        model=model,
        messages=items,
        tools=checked,
        tools_key=tools_key,
        tool_choice=_tool_choice(body.get("tool_choice")),
        temperature=temperature,
        top_p=top_p,
        max_tokens=_int(body, "max_output_tokens"),
        stream=stream,
    )
    return ResponsesRequest(chat, instructions, items, prev, store is not False, tools, metadata)


def _function_tools(v: Any) -> tuple[tuple[Mapping[str, Any], ...], list[dict[str, Any]]]:
    """The Responses function tools, and the same in the chat-completions form the session renders."""
    if v is None:
        return (), []
    if not isinstance(v, list):
        raise _bad("'tools' must be an array of function tools", "tools")
    chat = []
    for i, t in enumerate(v):
        if not isinstance(t, dict) or t.get("type") != "function":
            kind = t.get("type") if isinstance(t, dict) else None
            raise _bad(
                f"tools[{i}]: only function tools are supported (the agent runs its tools), got {kind!r}",
                f"tools[{i}].type",
            )
        # strict is kept in the schema the model sees; it is not enforced (no constrained decoding), as on
        # chat completions: a call whose arguments do not parse comes back as text.
        fn = {k: t[k] for k in ("name", "description", "parameters", "strict") if t.get(k) is not None}
        chat.append({"type": "function", "function": fn})
    return tuple(v), chat


def _text(content: Any, where: str, kinds: tuple[str, ...]) -> str:
    """A message's text: a string or text parts (``input_text``/``output_text``), joined by newlines."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise _bad(f"{where}.content must be a string or an array of content parts", f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds or not isinstance(part.get("text"), str):
            raise _bad(
                f"{where}.content[{j}]: only text parts ({'/'.join(kinds)}) are supported, got {kind!r} "
                "(images, files and audio are not: the policy reads text)",
                f"{where}.content[{j}].type",
            )
        texts.append(part["text"])
    return "\n".join(texts)


def _items(raw: list[Any]) -> tuple[WireMessage, ...]:
    out: list[WireMessage] = []
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _bad(f"{where} must be an input item object", where)
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            role = "system" if role == "developer" else role
            if not isinstance(role, str) or role not in ("system", "user", "assistant"):
                raise _bad(f"{where}.role must be user, system, developer or assistant", f"{where}.role")
            kinds = ("output_text", "input_text", "text") if role == "assistant" else ("input_text", "text")
            text = _text(item.get("content"), where, kinds)
            out.append(WireMessage(role, text))
        elif kind == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments")
            if not (
                isinstance(call_id, str) and call_id and isinstance(name, str) and name
            ) or not isinstance(args, str):
                raise _bad(f"{where}: a function_call needs 'call_id', 'name' and 'arguments' strings", where)
            call = WireCall.make(call_id, name, args)
            prev = out[-1] if out else None
            # A turn's calls follow its text item (or each other): they are one assistant message.
            if prev is not None and prev.role == "assistant" and (i > 0 and _joins(raw[i - 1])):
                out[-1] = replace(prev, tool_calls=(*prev.tool_calls, call))
            else:
                out.append(WireMessage("assistant", "", (call,)))
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str) or not call_id:
                raise _bad(f"{where}.call_id is required for a function_call_output", f"{where}.call_id")
            output = item.get("output")
            if isinstance(output, list):
                output = _text(output, where, ("input_text", "output_text", "text"))
            if not isinstance(output, str):
                raise _bad(f"{where}.output must be a string or text parts", f"{where}.output")
            out.append(WireMessage("tool", output, (), call_id))
        else:
            raise _bad(
                f"{where}: input items of type {kind!r} are not supported (messages, function_call and "
                "function_call_output are)",
                f"{where}.type",
            )
    return tuple(out)


def _joins(prev_item: Any) -> bool:
    """Whether a function_call after ``prev_item`` belongs to the same assistant turn."""
    if not isinstance(prev_item, dict):
        return False
    kind = prev_item.get("type", "message")
    return kind == "function_call" or (kind == "message" and prev_item.get("role") == "assistant")


# -------------------------------------------------------------------------------------------------
def output_items(message: Message, *, complete: bool) -> list[dict[str, Any]]:
    """The response's output items: the text as a ``message`` item (when there is text, or nothing else),
    then one ``function_call`` item per call."""
    items: list[dict[str, Any]] = []
    status = "completed" if complete else "incomplete"
    if message.content or not message.tool_calls:
        part = {"type": "output_text", "text": message.content, "annotations": [], "logprobs": []}
        items.append(
            {
                "type": "message",
                "id": f"msg_{uuid.uuid4().hex}",
                "status": status,
                "role": "assistant",
                "content": [part],
            }
        )
    for c in message.tool_calls:
        items.append(
            {
                "type": "function_call",
                "id": f"fc_{uuid.uuid4().hex}",
                "call_id": c.id,
                "name": c.name,
                "arguments": c.arguments,
                "status": "completed",
            }
        )
    return items


def response_body(
    req: ResponsesRequest,
    *,
    id: str,
    created: int,
    model: str,
    message: Message,
    finish_reason: str,
    prompt_tokens: int,
    completion_tokens: int,
) -> dict[str, Any]:
    """A ``response`` object, as the OpenAI API returns it (status ``incomplete`` for a cut turn)."""
    complete = finish_reason != "length"
    return {
        "id": id,
        "object": "response",
        "created_at": created,
        "status": "completed" if complete else "incomplete",
        "error": None,
        "incomplete_details": None if complete else {"reason": "max_output_tokens"},
        "instructions": req.instructions,
        "max_output_tokens": req.chat.max_tokens,
        "model": model,
        "output": output_items(message, complete=complete),
        "parallel_tool_calls": True,
        "previous_response_id": req.previous_response_id,
        "reasoning": {"effort": None, "summary": None},
        "store": req.store,
        "temperature": req.chat.temperature,
        "text": {"format": {"type": "text"}},
        "tool_choice": req.chat.tool_choice,
        "tools": [dict(t) for t in req.tools],
        "top_p": req.chat.top_p,
        "truncation": "disabled",
        "usage": {
            "input_tokens": prompt_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": completion_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "metadata": dict(req.metadata),
        "user": None,
    }


def response_events(response: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The same answer as the Responses stream: ``response.created``, ``response.in_progress``, each output
    item (added, its text or arguments as one delta, done), then ``response.completed`` (or
    ``response.incomplete``). The policy returns a whole turn at once, so each delta carries all of it."""
    pending = {**response, "status": "in_progress", "output": [], "usage": None}
    events: list[dict[str, Any]] = [
        {"type": "response.created", "response": pending},
        {"type": "response.in_progress", "response": pending},
    ]
    for k, item in enumerate(response["output"]):
        at = {"output_index": k, "item_id": item["id"]}
        if item["type"] == "message":
            text = item["content"][0]["text"]
            empty = {**item, "status": "in_progress", "content": []}
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            events += [
                {"type": "response.output_item.added", "output_index": k, "item": empty},
                {"type": "response.content_part.added", **at, "content_index": 0, "part": part},
                {
                    "type": "response.output_text.delta",
                    **at,
                    "content_index": 0,
                    "delta": text,
                    "logprobs": [],
                },
                {"type": "response.output_text.done", **at, "content_index": 0, "text": text, "logprobs": []},
                {"type": "response.content_part.done", **at, "content_index": 0, "part": item["content"][0]},
            ]
        else:
            args = item["arguments"]
            events += [
                {
                    "type": "response.output_item.added",
                    "output_index": k,
                    "item": {**item, "arguments": "", "status": "in_progress"},
                },
                {"type": "response.function_call_arguments.delta", **at, "delta": args},
                {
                    "type": "response.function_call_arguments.done",
                    **at,
                    "name": item["name"],
                    "arguments": args,
                },
            ]
        events.append({"type": "response.output_item.done", "output_index": k, "item": item})
    done = "response.completed" if response["status"] == "completed" else "response.incomplete"
    events.append({"type": done, "response": response})
    return [{**e, "sequence_number": n} for n, e in enumerate(events)]


def encode_events(events: Sequence[Mapping[str, Any]]) -> list[str]:
    """Server-sent events with an ``event:`` line naming each (as both OpenAI and Anthropic stream)."""
    return [f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events]
