"""The OpenAI Agents SDK (``openai-agents``) through the gateway: an ``Agent`` with a ``@function_tool``, run
by ``Runner.run`` on the SDK's default model (the Responses API) and on its chat-completions model. The SDK
runs the tool; the session records one audited segment with both calls and the answer."""

from __future__ import annotations

import openai
import pytest
from agents import (
    Agent,
    OpenAIChatCompletionsModel,
    OpenAIResponsesModel,
    RunConfig,
    Runner,
    function_tool,
)

from agentrl.audit import audit_trajectory
from agentrl.trainers.gateway import Gateway
from agentrl.types import StopReason

from .helpers import QUESTION, SYSTEM, scripted

CALLS: list[str] = []


@function_tool
def echo(text: str) -> str:
    """Return the text unchanged.

    Args:
        text: Text to echo.
    """
    CALLS.append(text)
    return text


@pytest.mark.parametrize("model_kind", ["responses", "chat_completions"])
async def test_runner_run_records_an_audited_session(renderer, model_kind):
    CALLS.clear()
    async with Gateway(scripted(renderer), renderer) as gw:
        client = openai.AsyncOpenAI(base_url=gw.base_url("agent"), api_key="unused", max_retries=0)
        try:
            if model_kind == "responses":
                model: object = OpenAIResponsesModel(model="policy", openai_client=client)
            else:
                model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
            agent = Agent(name="echoer", instructions=SYSTEM, tools=[echo], model=model)  # type: ignore[arg-type]
            # tracing off: its exporter would post to api.openai.com
            result = await Runner.run(agent, QUESTION, run_config=RunConfig(tracing_disabled=True))
        finally:
            await client.close()
        assert gw.core.session_api("agent") == (
            "responses" if model_kind == "responses" else "chat.completions"
        )
        (traj,) = await gw.finish("agent", float(result.final_output == "Answer: hello"))
    assert CALLS == ["hello", "again"] and result.final_output == "Answer: hello"
    assert (traj.num_turns, traj.reward, traj.stop_reason, traj.errors) == (3, 1.0, StopReason.TERMINATED, ())
    assert traj.meta.extra["segments"] == 1 and [r.output for r in traj.tool_calls] == ["hello", "again"]
    audit_trajectory(traj, renderer)
