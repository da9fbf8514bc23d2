"""long-chain-v0: its three context modes pass check_env (a right episode scores, seeded episodes repeat),
compaction happens where the mode says, and bad options are refused with a clear error."""

import asyncio

import pytest

import agentrl
from agentrl import Action, Message
from agentrl.envs.long_chain import ContextMode, LongChainEnv, expert_turns
from agentrl.errors import ConfigError

MODES = [m.value for m in ContextMode]


@pytest.mark.parametrize("mode", MODES)
def test_each_mode_passes_check_env(mode):
    agentrl.check_env(agentrl.make("long-chain-v0", context=mode, k=8, compact_every=3))


async def play(env, turns):
    results = []
    for text in turns:
        results.append(await env.step(Action(text)))
        if results[-1].terminated or results[-1].truncated:
            break
    return results


@pytest.mark.parametrize("mode", MODES)
def test_compaction_happens_where_the_mode_says(mode):
    env = LongChainEnv(k=8, context=mode, compact_every=3)
    asyncio.run(env.reset(seed=5))
    nums = env.numbers
    results = asyncio.run(play(env, expert_turns(nums, mode, 3)))
    compacted = [r.compact for r in results if r.compact is not None]
    assert results[-1].terminated and results[-1].reward == 1.0
    if mode == "truncate":
        assert compacted == []
    else:  # after calls 3 and 6 of 7: the running sum, then what is left to add
        assert compacted == [
            (Message("user", " ".join(map(str, [sum(nums[:4]), *nums[4:]]))),),
            (Message("user", " ".join(map(str, [sum(nums[:7]), nums[7]]))),),
        ]
    asks = [r for r in results if r.observation and r.observation[-1] == Message("user", "C")]
    assert len(asks) == (2 if mode == "policy-compaction" else 0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"context": "sliding"}, "context must be one of"),
        ({"k": 1}, "k must be"),
        ({"compact_every": 0}, "compact_every"),
        ({"split": "dev"}, "split"),
    ],
)
def test_bad_options_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        agentrl.make("long-chain-v0", **kwargs)


def test_the_full_history_outgrows_the_recommended_budget():
    """What makes the env long-horizon: one sample fits the recommended budget, the whole history does not
    (counted in characters, the tokens of the character-level policy)."""
    from agentrl.envs.long_chain import RECOMMENDED_MAX_TOTAL_TOKENS

    env = LongChainEnv(k=16)
    asyncio.run(env.reset(seed=0))
    turns = expert_turns(env.numbers, "truncate", 4)
    full = len(" ".join(map(str, env.numbers))) + sum(len(t) + 8 for t in turns)
    first = len(" ".join(map(str, env.numbers))) + sum(len(t) + 8 for t in turns[:4])
    assert first < RECOMMENDED_MAX_TOTAL_TOKENS < full
