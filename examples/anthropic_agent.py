"""An agent written against the ``anthropic`` SDK (Anthropic Messages; it imports nothing from agentrl).

It offers the task's tools to the model as Anthropic tools, runs the calculator calls itself, and scores
the final 'Answer: N'. The gateway serves ``POST /v1/messages`` at the session's URL without its ``/v1``
(the anthropic client adds it). Train it through the recording gateway:

    agentrl train --agent examples/anthropic_agent.py:solve --env calculator-v0 --model tiny --steps 1

As with examples/gateway_agent.py, this shows the plumbing (sessions, rewards, recorded trajectories), not
learning: a tiny or 135M model does not call the calculator reliably.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import anthropic

sys.path.insert(0, str(Path(__file__).parent))  # the sibling example's small arithmetic evaluator
from gateway_agent import calculate


async def solve(task, base_url: str) -> float:
    """One episode: returns 1.0 for the right final answer, else 0.0."""
    client = anthropic.AsyncAnthropic(base_url=base_url.removesuffix("/v1"), api_key="unused", max_retries=0)
    system = "\n\n".join(m["content"] for m in task.messages if m["role"] == "system")
    messages: list = [
        {"role": m["role"], "content": m["content"]} for m in task.messages if m["role"] != "system"
    ]
    tools: list = [
        {
            "name": t["function"]["name"],
            "description": t["function"].get("description", ""),
            "input_schema": t["function"].get("parameters", {"type": "object"}),
        }
        for t in task.tools
    ]
    try:
        for _ in range(4):
            reply = await client.messages.create(
                model="policy", max_tokens=96, system=system, messages=messages, tools=tools
            )
            messages.append(
                {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in reply.content]}
            )
            uses = [b for b in reply.content if b.type == "tool_use"]
            if reply.stop_reason != "tool_use":
                text = "".join(b.text for b in reply.content if b.type == "text")
                found = re.findall(r"Answer:\s*(-?\d+)", text)
                return float(bool(found) and int(found[-1]) == int(task.info["answer"]))
            results = [
                {
                    "type": "tool_result",
                    "tool_use_id": b.id,
                    "content": calculate(str(b.input.get("expression", ""))),
                }
                for b in uses
            ]
            messages.append({"role": "user", "content": results})
    except anthropic.BadRequestError:  # the gateway's turn or context limit: the episode is over
        pass
    finally:
        await client.close()
    return 0.0
