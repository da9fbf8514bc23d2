"""The env contract: StepResult (validated, typed), the 5-tuple rule, the random stream's name."""

import math
import random

import pytest

import agentrl
from agentrl import Action, Env, Message, StepResult, ToolRecord, ToolStatus, as_step_result
from agentrl.errors import EnvContractError
from agentrl.testing import EchoEnv

REC = ToolRecord("c0", "python", "{}", "42", ToolStatus.OK, 0.01, 0)
BROKEN = ToolRecord("c1", "python", "{}", "not shown", ToolStatus.SANDBOX_ERROR, 0.01, 0, detail="bwrap died")


def test_step_result_holds_typed_fields_and_keeps_info_for_the_env():
    res = StepResult(
        [Message("tool", "42")],
        1,
        terminated=True,
        assistant_message=Message("assistant", "x"),
        tool_calls=[REC],
        info={"assistant_message": "mine", "anything": [1, 2]},
    )
    assert res.observation == (Message("tool", "42"),) and res.tool_calls == (REC,)  # lists become tuples
    assert isinstance(res.reward, float) and res.reward == 1.0
    assert res.info["assistant_message"] == "mine"  # info is free: agentrl reads nothing in it
    assert res.infra_error is None
    assert StepResult(tool_calls=(REC, BROKEN)).infra_error == "bwrap died"
    assert res.to_gymnasium() == ((Message("tool", "42"),), 1.0, True, False, dict(res.info))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(observation="hi"), "tuple of Message"),
        (dict(observation=({"role": "user", "content": "x"},)), "tuple of Message"),
        (dict(reward=math.nan), "finite float"),
        (dict(reward=True), "finite float"),
        (dict(reward="1"), "finite float"),
        (dict(terminated=1), "must be bools"),
        (dict(assistant_message=Message("user", "x")), "assistant Message"),
        (dict(tool_calls=({"call_id": "c0"},)), "tuple of ToolRecord"),
        (dict(info=[("a", 1)]), "info must be a dict"),
    ],
)
def test_step_result_rejects_bad_fields(kwargs, match):
    with pytest.raises(EnvContractError, match=match):
        StepResult(**kwargs)


def test_a_gymnasium_five_tuple_is_read_as_a_step_result_without_records():
    res = as_step_result(((Message("user", "again"),), 0.5, False, True, {"tool_records": "mine"}))
    assert res == StepResult((Message("user", "again"),), 0.5, False, True, info={"tool_records": "mine"})
    assert res.assistant_message is None and res.tool_calls == ()
    same = StepResult(reward=1.0)
    assert as_step_result(same) is same
    with pytest.raises(EnvContractError, match="StepResult or"):
        as_step_result(((), 0.0, True, False))
    with pytest.raises(EnvContractError, match="finite float"):
        as_step_result(((), float("inf"), True, False, {}))


@pytest.mark.parametrize(
    "info",
    [{"assistant_message": Message("assistant", "x")}, {"tool_records": (REC,)}],
    ids=["msg", "records"],
)
def test_agentrl_records_left_in_info_are_an_error_not_silently_dropped(info):
    """The old contract put the parsed message and the tool records into info; they are no longer read,
    so a 5-tuple still carrying them is refused with the way out."""
    with pytest.raises(EnvContractError, match="return StepResult"):
        as_step_result(((), 0.0, True, False, info))


async def test_rng_is_a_seeded_random_random_and_np_random_is_a_deprecated_alias():
    env = EchoEnv()
    await env.reset(seed=4)
    assert isinstance(env.rng, random.Random)
    first = env.word
    await env.reset()
    await env.reset(seed=4)
    assert env.word == first
    with pytest.warns(DeprecationWarning, match="Env.rng"):
        assert env.np_random is env.rng


def test_an_env_returning_the_five_tuple_passes_check_env():
    class Legacy(Env):
        async def reset(self, *, seed=None, options=None):
            self.seed(seed)
            return (Message("user", f"say {self.rng.randint(0, 9)}"),), {}

        async def step(self, action: Action):
            return (), 1.0, True, False, {}

    agentrl.check_env(Legacy())
