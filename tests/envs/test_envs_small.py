"""calculator-v0 and shop-v0: scripted episodes through their tools, as a model would play them."""

from __future__ import annotations

import json
import re

import pytest

import agentrl
from agentrl import INFO_TOOL_RECORDS, Action, ToolStatus


def hermes(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


@pytest.mark.parametrize("seed", [5, 6])  # one of each question template
async def test_calculator_env_episode_with_the_calculator(seed):
    env = agentrl.make("calculator-v0", digits=7)
    obs, info = await env.reset(seed=seed)
    numbers = [int(n) for n in re.findall(r"\d+", obs[-1].content)]
    assert len(numbers) == 4 and len(str(numbers[0])) == 7 and info["answer"] > 0
    assert "<tools>" in obs[0].content and '"name": "calculator"' in obs[0].content
    a, b, c, d = numbers
    expression = f"{a} * {b} - {c} * {d}" if "bolts" in obs[-1].content else f"{a} * {b} + {c} * {d}"
    obs, reward, terminated, _, step_info = await env.step(
        Action(hermes("calculator", expression=expression))
    )
    assert not terminated and step_info[INFO_TOOL_RECORDS][0].status is ToolStatus.OK
    assert obs[0].role == "tool" and int(obs[0].content) == info["answer"]
    _, reward, terminated, _, _ = await env.step(Action(f"Answer: {obs[0].content}"))
    assert terminated and reward == 1.0


async def shop_episode(first_answer_off_by: int) -> tuple[float, int]:
    env = agentrl.make("shop-v0")
    obs, info = await env.reset(seed=9)
    question = obs[-1].content
    basket = re.findall(r"(\d) (\w+)", question.split(" and have")[0])
    code = re.search(r"coupon (\w+)", question).group(1)
    lookups = "".join(hermes("price", item=item) for _, item in basket) + hermes("coupon", code=code)
    obs, _, _, _, step_info = await env.step(Action(lookups))
    assert [r.status for r in step_info[INFO_TOOL_RECORDS]] == [ToolStatus.OK] * (len(basket) + 1)
    prices, percent = [int(m.content) for m in obs[:-1]], int(obs[-1].content)
    total = " + ".join(f"{n} * {p}" for (n, _), p in zip(basket, prices, strict=True))
    obs, *_ = await env.step(Action(hermes("calculator", expression=f"({total}) * (100 - {percent}) // 100")))
    turns = 2
    answer = int(obs[0].content)
    assert answer == info["answer"]
    obs, reward, terminated, _, _ = await env.step(Action(f"Answer: {answer + first_answer_off_by}"))
    turns += 1
    if not terminated:
        assert obs[0].role == "user" and "not right" in obs[0].content
        obs, reward, terminated, _, _ = await env.step(Action(f"Answer: {answer}"))
        turns += 1
    assert terminated
    return reward, turns


async def test_shop_env_episode_uses_three_tools_over_several_turns():
    assert await shop_episode(0) == (1.0, 3)


async def test_shop_env_gives_one_retry_for_half_reward():
    assert await shop_episode(1) == (0.5, 4)


async def test_shop_env_misspelled_item_gets_a_suggestion():
    env = agentrl.make("shop-v0")
    await env.reset(seed=1)
    obs, *_ = await env.step(Action(hermes("price", item="aple")))
    assert "Did you mean: apple?" in obs[0].content
