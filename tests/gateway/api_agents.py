"""The echo agent of helpers.py written against the two other APIs, with their real clients: the OpenAI
Responses API (``openai`` client) and Anthropic Messages (``anthropic`` client). Each runs the echo tool
itself and scores 'Answer: hello', as :func:`helpers.echo_agent` does over chat completions."""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai

from .helpers import ECHO_SCHEMA, QUESTION, SYSTEM

RESPONSES_TOOLS = [{"type": "function", **ECHO_SCHEMA["function"]}]
"""The echo tool in the Responses form."""

ANTHROPIC_TOOLS = [
    {
        "name": ECHO_SCHEMA["function"]["name"],
        "description": ECHO_SCHEMA["function"]["description"],
        "input_schema": ECHO_SCHEMA["function"]["parameters"],
    }
]
"""The echo tool in the Anthropic form."""


async def responses_echo_agent(
    base_url: str, *, stream: bool = False, chain: bool = False, store: bool = True
) -> float:
    """The echo agent over ``POST /v1/responses``: with ``chain`` each request sends only the new items
    and ``previous_response_id``; otherwise the whole item list."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    items: list[Any] = [{"role": "user", "content": QUESTION}]
    new: list[Any] = list(items)
    prev: str | None = None
    try:
        for _ in range(8):
            kw: dict[str, Any] = dict(
                model="policy", instructions=SYSTEM, tools=RESPONSES_TOOLS, max_output_tokens=64, store=store
            )
            kw.update(input=new, previous_response_id=prev) if chain and prev else kw.update(input=items)
            if stream:
                resp, text = None, ""
                async for event in await client.responses.create(**kw, stream=True):
                    if event.type == "response.output_text.delta":
                        text += event.delta
                    if event.type in ("response.completed", "response.incomplete"):
                        resp = event.response
                assert resp is not None and text == resp.output_text
            else:
                resp = await client.responses.create(**kw)
            prev = resp.id
            output = [o.model_dump(exclude_none=True) for o in resp.output]
            items += output
            calls = [o for o in resp.output if o.type == "function_call"]
            if not calls:
                return float("Answer: hello" in resp.output_text)
            new = [
                {
                    "type": "function_call_output",
                    "call_id": c.call_id,
                    "output": json.loads(c.arguments)["text"],
                }
                for c in calls
            ]
            items += new
        return 0.0
    finally:
        await client.close()


async def anthropic_echo_agent(base_url: str, *, stream: bool = False, api_key: str = "unused") -> float:
    """The echo agent over ``POST /v1/messages`` (``base_url`` without ``/v1``, as the client wants it)."""
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key=api_key, max_retries=0)
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    try:
        for _ in range(8):
            kw: dict[str, Any] = dict(
                model="policy", max_tokens=64, system=SYSTEM, messages=messages, tools=ANTHROPIC_TOOLS
            )
            if stream:
                async with client.messages.stream(**kw) as s:
                    msg = await s.get_final_message()
            else:
                msg = await client.messages.create(**kw)
            messages.append(
                {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]}
            )
            uses = [b for b in msg.content if b.type == "tool_use"]
            if msg.stop_reason != "tool_use":
                return float(any("Answer: hello" in b.text for b in msg.content if b.type == "text"))
            results = [{"type": "tool_result", "tool_use_id": b.id, "content": b.input["text"]} for b in uses]
            messages.append({"role": "user", "content": results})
        return 0.0
    finally:
        await client.close()
