"""calculator-v0 and shop-v0: scripted episodes through their tools, as a model would play them."""

from __future__ import annotations

import json
import re

import pytest

import agentrl
from agentrl import Action, ToolStatus


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
    res = await env.step(Action(hermes("calculator", expression=expression)))
    assert not res.terminated and res.tool_calls[0].status is ToolStatus.OK
    obs = res.observation
    assert obs[0].role == "tool" and int(obs[0].content) == info["answer"]
    res = await env.step(Action(f"Answer: {obs[0].content}"))
    assert res.terminated and res.reward == 1.0


async def shop_episode(first_answer_off_by: int) -> tuple[float, int]:
    env = agentrl.make("shop-v0")
    obs, info = await env.reset(seed=9)
    question = obs[-1].content
    basket = re.findall(r"(\d) (\w+)", question.split(" and have")[0])
    code = re.search(r"coupon (\w+)", question).group(1)
    lookups = "".join(hermes("price", item=item) for _, item in basket) + hermes("coupon", code=code)
    res = await env.step(Action(lookups))
    assert [r.status for r in res.tool_calls] == [ToolStatus.OK] * (len(basket) + 1)
    obs = res.observation
    prices, percent = [int(m.content) for m in obs[:-1]], int(obs[-1].content)
    total = " + ".join(f"{n} * {p}" for (n, _), p in zip(basket, prices, strict=True))
    res = await env.step(Action(hermes("calculator", expression=f"({total}) * (100 - {percent}) // 100")))
    turns = 2
    answer = int(res.observation[0].content)
    assert answer == info["answer"]
    res = await env.step(Action(f"Answer: {answer + first_answer_off_by}"))
    turns += 1
    if not res.terminated:
        assert res.observation[0].role == "user" and "not right" in res.observation[0].content
        res = await env.step(Action(f"Answer: {answer}"))
        turns += 1
    assert res.terminated
    return res.reward, turns


async def test_shop_env_episode_uses_three_tools_over_several_turns():
    assert await shop_episode(0) == (1.0, 3)


async def test_shop_env_gives_one_retry_for_half_reward():
    assert await shop_episode(1) == (0.5, 4)


async def test_shop_env_misspelled_item_gets_a_suggestion():
    env = agentrl.make("shop-v0")
    await env.reset(seed=1)
    obs = (await env.step(Action(hermes("price", item="aple")))).observation
    assert "Did you mean: apple?" in obs[0].content
