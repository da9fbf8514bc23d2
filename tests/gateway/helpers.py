"""Shared pieces of the gateway tests: a scripted policy over the real SmolLM2 tokenizer, a tool env whose
native rollout the gateway must reproduce, and an agent written only against the ``openai`` client."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import openai

from agentrl.chat import ChatRenderer
from agentrl.envs import Task, ToolEnv
from agentrl.testing import EchoTool, ScriptedPolicy

SYSTEM = "You repeat words with the echo tool, then answer."
QUESTION = "Echo hello, then echo again, then answer 'Answer: hello'."
ECHO_SCHEMA = EchoTool.schema


def call(name: str, **arguments: Any) -> str:
    """A Hermes tool call as the model would write it."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


SCRIPT = (call("echo", text="hello"), f"Let me check.\n{call('echo', text='again')}", "Answer: hello")
"""Three turns: a call, text plus a call, the final answer."""


def scripted(renderer: ChatRenderer, texts: Sequence[str] = SCRIPT, *, stop: bool = True) -> ScriptedPolicy:
    """A policy that samples ``texts`` in order (each ending with the end-of-turn token when ``stop``)."""
    end = [renderer.stop_token_ids[0]] if stop else []
    turns = [[*renderer.encode(t), *end] for t in texts]
    return ScriptedPolicy(turns, stop_ids=renderer.stop_token_ids, logprob=-0.25)


class EchoToolEnv(ToolEnv):
    """The native counterpart of :func:`echo_agent`: the echo tool, Hermes calls, answer 'hello'."""

    def __init__(self, **kwargs: Any):
        super().__init__([EchoTool()], parser="hermes", system_prompt=SYSTEM, **kwargs)

    def make_task(self, options: dict[str, Any]) -> Task:
        return Task(QUESTION, answer="hello")


async def echo_agent(base_url: str, *, stream: bool = False, max_turns: int = 8) -> float:
    """An agent written only against the openai client: runs the echo tool itself, scores the answer."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": QUESTION},
    ]
    try:
        for _ in range(max_turns):
            if stream:
                msg = await _streamed(client, messages)
            else:
                reply = await client.chat.completions.create(
                    model="policy",
                    messages=messages,
                    tools=[ECHO_SCHEMA],
                    max_tokens=64,  # type: ignore[list-item]
                )
                msg = reply.choices[0].message.model_dump(exclude_none=True)
            messages.append(msg)
            if not msg.get("tool_calls"):
                return float("Answer: hello" in (msg.get("content") or ""))
            for c in msg["tool_calls"]:
                args = json.loads(c["function"]["arguments"])
                messages.append({"role": "tool", "tool_call_id": c["id"], "content": args["text"]})
        return 0.0
    finally:
        await client.close()


async def _streamed(client: openai.AsyncOpenAI, messages: list[dict[str, Any]]) -> dict[str, Any]:
    content, calls = "", {}
    stream = await client.chat.completions.create(
        model="policy",
        messages=messages,
        tools=[ECHO_SCHEMA],
        stream=True,  # type: ignore[list-item]
    )
    async for chunk in stream:
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for tc in ch.delta.tool_calls or ():
                slot = calls.setdefault(
                    tc.index, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}}
                )
                slot["id"] += tc.id or ""
                if tc.function is not None:
                    slot["function"]["name"] += tc.function.name or ""
                    slot["function"]["arguments"] += tc.function.arguments or ""
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [calls[i] for i in sorted(calls)]
    return msg


OPEN_CLIENTS: list[openai.AsyncOpenAI] = []
"""Clients made by :func:`client_for`; the ``close_clients`` fixture (conftest.py) closes them after each
test, so their pooled sockets are not left to the garbage collector (a ResourceWarning in a later test)."""


def client_for(base_url: str) -> openai.AsyncOpenAI:
    """The real openai client, without retries (a test wants to see each error)."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="any-key", max_retries=0)
    OPEN_CLIENTS.append(client)
    return client


async def ask(
    client: openai.AsyncOpenAI, messages: list[dict[str, Any]], **kw: Any
) -> tuple[dict[str, Any], str]:
    """One chat completion: (the assistant message as the agent would resend it, finish_reason)."""
    kw.setdefault("tools", [ECHO_SCHEMA])
    reply = await client.chat.completions.create(model="policy", messages=messages, **kw)  # type: ignore[arg-type]
    choice = reply.choices[0]
    return choice.message.model_dump(exclude_none=True), choice.finish_reason


def tool_result(msg: dict[str, Any], content: str = "hello") -> dict[str, Any]:
    """The tool message answering the first call of ``msg``."""
    return {"role": "tool", "tool_call_id": msg["tool_calls"][0]["id"], "content": content}


START = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
"""The opening messages of the echo conversation."""


def assert_harness_run_recorded(out, returncode, stderr, session, task):
    """After a harness CLI ran through ``agentrl gateway --out out``: the gateway stopped cleanly, the
    harness's requests reached session ``session``, its trajectories carry ``task`` and ``replay --check``
    passes."""
    import subprocess

    from agentrl import read_trajectories

    from .test_cli import AGENTRL

    assert returncode == 0, stderr[-2000:]
    assert f"gateway: session {session} 200" in stderr  # the harness's requests went through the gateway
    trajs = list(read_trajectories(out / "trajectories.jsonl"))
    assert trajs and all(t.meta.task_id == task and not t.infra_failure for t in trajs)
    check = subprocess.run(
        [*AGENTRL, "replay", str(out), "--check"], capture_output=True, text=True, timeout=300
    )
    n = len(trajs)
    assert check.returncode == 0 and f"{n} of {n} trajectories consistent" in check.stdout, check.stdout
