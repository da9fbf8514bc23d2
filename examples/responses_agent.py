"""An agent written against the OpenAI Agents SDK (``openai-agents``; it imports nothing from agentrl).

The SDK's ``Agent`` with a ``@function_tool`` calculator, run by ``Runner.run`` on the SDK's default model
class, ``OpenAIResponsesModel`` (the Responses API, ``POST /v1/responses``), pointed at the session's
``base_url``. It solves calculator-v0's word problems and scores the final 'Answer: N'. Train it through the
recording gateway:

    agentrl train --agent examples/responses_agent.py:solve --env calculator-v0 --model tiny --steps 1

As with examples/gateway_agent.py, this shows the plumbing (sessions, rewards, recorded trajectories), not
learning: a tiny or 135M model does not call the calculator reliably.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import openai
from agents import Agent, ModelSettings, OpenAIResponsesModel, RunConfig, Runner, function_tool
from agents.exceptions import MaxTurnsExceeded, ModelBehaviorError

sys.path.insert(0, str(Path(__file__).parent))  # the sibling example's small arithmetic evaluator
from gateway_agent import calculate


@function_tool
def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression (+ - * //).

    Args:
        expression: The expression, e.g. "3 * (4 + 5)".
    """
    return calculate(expression)


async def solve(task, base_url: str) -> float:
    """One episode: returns 1.0 for the right final answer, else 0.0."""
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    system = next((m["content"] for m in task.messages if m["role"] == "system"), "")
    agent = Agent(
        name="calculator",
        instructions=system,
        tools=[calculator],
        model=OpenAIResponsesModel(model="policy", openai_client=client),
        model_settings=ModelSettings(max_tokens=96),
    )
    try:
        # tracing off: the SDK's exporter would post the run to api.openai.com
        result = await Runner.run(
            agent, task.prompt, max_turns=4, run_config=RunConfig(tracing_disabled=True)
        )
        found = re.findall(r"Answer:\s*(-?\d+)", str(result.final_output or ""))
        return float(bool(found) and int(found[-1]) == int(task.info["answer"]))
    except (openai.BadRequestError, MaxTurnsExceeded, ModelBehaviorError):
        # The gateway's limits, the SDK's turn limit, or a turn cut by max_tokens (the SDK raises on an
        # incomplete response): the episode is over, unsolved.
        return 0.0
    finally:
        await client.close()
