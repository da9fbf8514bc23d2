"""The gateway reads tool calls with the same parsers as ToolEnv (agentrl.tools.PARSERS): an agent on the
openai client gets the calls of a model that writes Llama-3 JSON, Mistral or harmony calls as OpenAI
``tool_calls``, and the recorded trajectory has them."""

from __future__ import annotations

import json

import pytest

from agentrl.trainers.gateway import Gateway
from agentrl.trainers.gateway.session import GatewayConfig

from .helpers import echo_agent, scripted

WRITTEN = {
    "llama3_json": lambda text: json.dumps({"name": "echo", "parameters": {"text": text}}),
    "mistral": lambda text: "[TOOL_CALLS]" + json.dumps([{"name": "echo", "arguments": {"text": text}}]),
    "harmony": lambda text: (
        "<|channel|>commentary to=functions.echo <|constrain|>json<|message|>"
        + json.dumps({"text": text})
        + "<|call|>"
    ),
}


@pytest.mark.parametrize("fmt", sorted(WRITTEN))
async def test_the_gateway_reads_each_family_format(renderer, fmt):
    script = (WRITTEN[fmt]("hello"), WRITTEN[fmt]("again"), "Answer: hello")
    async with Gateway(scripted(renderer, script), renderer, GatewayConfig(parser=fmt)) as gw:
        reward = await echo_agent(gw.base_url("s1"))
        (traj,) = await gw.finish("s1", reward)
    assert reward == 1.0
    assert [(r.name, json.loads(r.arguments)) for r in traj.tool_calls] == [
        ("echo", {"text": "hello"}),
        ("echo", {"text": "again"}),
    ]
