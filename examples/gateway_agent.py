"""An agent written only against the ``openai`` client (it imports nothing from agentrl).

It solves calculator-v0's word problems: it offers the task's calculator tool to the model, runs the calls
itself with a small arithmetic evaluator, and scores the final 'Answer: N' against the task's answer.
Train it through the recording gateway:

    agentrl train --agent examples/gateway_agent.py:solve --env calculator-v0 --model tiny --steps 1

This example shows the plumbing only (an agent, its sessions, rewards and the recorded trajectories), not
learning: SmolLM2-135M-Instruct does not call the calculator here. Through the gateway it made 0 tool calls
in about 10 turns at max_tokens=96 (every turn cut), and 0 in 3 sessions with a demonstration call in the
template's format in the prompt and max_tokens=256 (2 turns cut at 256 tokens, 1 bare answer); reward 0
each time (2026-11-27, 2-core CPU shared with other work). A model that already calls tools, or an env whose
reward does not need them, is what makes this loop learn.
"""

from __future__ import annotations

import ast
import json
import operator
import re

import openai

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def calculate(expression: str) -> str:
    """+ - * // on integers, or an error message for the model."""

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError("only integers with + - * // are supported")

    try:
        return str(value(ast.parse(expression, mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e}"


async def solve(task, base_url: str) -> float:
    """One episode: returns 1.0 for the right final answer, else 0.0."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages = list(task.messages)
    try:
        for _ in range(4):
            reply = await client.chat.completions.create(
                model="policy", messages=messages, tools=list(task.tools), max_tokens=96
            )
            msg = reply.choices[0].message
            messages.append(msg.model_dump(exclude_none=True))
            if not msg.tool_calls:
                found = re.findall(r"Answer:\s*(-?\d+)", msg.content or "")
                return float(bool(found) and int(found[-1]) == int(task.info["answer"]))
            for call in msg.tool_calls:
                try:
                    expression = str(json.loads(call.function.arguments).get("expression", ""))
                except (ValueError, AttributeError):
                    expression = ""
                messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(expression)})
    except openai.BadRequestError:  # the gateway's turn or context limit: the episode is over
        pass
    finally:
        await client.close()
    return 0.0
