"""register/make/list_envs, lazy plug-ins, the explicit Gymnasium bridge, and check_env's contract checks."""

import subprocess
import sys

import gymnasium
import pytest

import agentrl
from agentrl import Action, Env, Message
from agentrl.errors import ConfigError, EnvContractError, EnvNotFoundError
from agentrl.testing import EchoEnv


@pytest.fixture
def gym_bridge():
    """Gymnasium's registry is written only on request."""
    return agentrl.register_gymnasium()


def test_builtin_envs_are_registered_through_the_entry_point():
    ids = agentrl.list_envs()
    assert {"guess-number-v0", "exact-answer-v0"} <= set(ids)


def test_import_has_no_side_effects_and_registration_is_lazy_or_explicit():
    """``import agentrl`` imports no plug-in and writes nothing into Gymnasium's registry; agentrl's own
    registry loads plug-ins on first use; Gymnasium's is written by register_gymnasium() only."""
    code = (
        "import sys, gymnasium, agentrl\n"
        "gym = lambda: sorted(k for k in gymnasium.registry if k.startswith('agentrl/'))\n"
        "assert 'agentrl.envs' not in sys.modules and gym() == []\n"
        "assert 'exact-answer-v0' in agentrl.list_envs() and 'agentrl.envs' in sys.modules\n"
        "assert gym() == []\n"
        "ids = agentrl.register_gymnasium()\n"
        "assert 'agentrl/exact-answer-v0' in ids and gym() == ids, (ids, gym())\n"
        "agentrl.register('late-echo-v0', 'agentrl.testing:EchoEnv')\n"
        "assert 'agentrl/late-echo-v0' in gym()\n"
        "print(gymnasium.make('agentrl/late-echo-v0').reset(seed=1)[0])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "Repeat exactly" in out.stdout


def test_gymnasium_observations_are_in_the_text_space(gym_bridge):
    # The catalogue (tests/envs/test_catalogue.py) runs both checkers over every registered id.
    env = gymnasium.make("agentrl/exact-answer-v0")
    obs, _ = env.reset(seed=3)
    assert env.observation_space.contains(obs) and '"role": "user"' in obs
    env.close()


def test_register_make_with_defaults_and_overrides():
    agentrl.register("test-echo-v0", EchoEnv)
    agentrl.register("test-guess-v0", "agentrl.envs.guess_number:GuessNumberEnv", high=10)
    env = agentrl.make("test-guess-v0")
    assert env.high == 10 and env.spec_id == "test-guess-v0"
    assert agentrl.make("test-guess-v0", high=20).high == 20
    assert isinstance(agentrl.make("test-echo-v0"), EchoEnv)


@pytest.mark.parametrize(
    "args, exc, match",
    [
        (("bad id", EchoEnv), ConfigError, "name-v0"),
        (("noversion", EchoEnv), ConfigError, "name-v0"),
        (("x-v0", "no_colon"), ConfigError, "module:Name"),
        (("x-v0", 42), ConfigError, "callable"),
        (
            ("test-echo-v0", "agentrl.envs.guess_number:GuessNumberEnv"),
            ConfigError,
            "already registered",
        ),
    ],
)
def test_register_rejects_bad_input(args, exc, match):
    agentrl.register("test-echo-v0", EchoEnv)
    with pytest.raises(exc, match=match):
        agentrl.register(*args)


def test_make_errors_are_clear():
    with pytest.raises(EnvNotFoundError, match="guess-number-v0"):
        agentrl.make("guess-number-v9")
    with pytest.raises(ConfigError, match="low < high"):
        agentrl.make("guess-number-v0", low=5, high=1)
    with pytest.raises(ConfigError, match="cannot build"):
        agentrl.make("guess-number-v0", nonsense=1)
    agentrl.register("test-notenv-v0", lambda: object())
    with pytest.raises(EnvContractError, match=r"not an agentrl\.Env"):
        agentrl.make("test-notenv-v0")
    agentrl.register("test-missing-v0", "agentrl.envs.nowhere:Nope")
    with pytest.raises(ConfigError, match="cannot load"):
        agentrl.make("test-missing-v0")


async def test_guess_number_episode_semantics():
    env = agentrl.make("guess-number-v0", low=1, high=4, max_guesses=2)
    _, info = await env.reset(seed=0)
    target = info["target"]
    wrong = 1 if target != 1 else 2
    res = await env.step(Action(str(wrong)))
    assert (res.reward, res.terminated, res.truncated) == (0.0, False, False)
    assert "Higher" in res.observation[0].content or "Lower" in res.observation[0].content
    res = await env.step(Action(str(wrong)))  # out of guesses: truncated by the game's rule
    assert res.to_gymnasium() == ((), 0.0, False, True, {"guesses": 2})
    await env.reset(seed=0)
    res = await env.step(Action(f"I guess {target}"))
    assert (res.reward, res.terminated, res.truncated) == (1.0, True, False)


class _Broken(Env):
    def __init__(self, mode):
        self.mode = mode

    async def reset(self, *, seed=None, options=None):
        self.seed(seed)
        if self.mode == "reset":
            return [Message("user", "hi")], {}  # a list, not a tuple
        if self.mode == "nondeterministic":
            self.calls = getattr(self, "calls", 0) + 1
            return (Message("user", str(self.calls)),), {}
        return (Message("user", "hi"),), {}

    async def step(self, action):
        if self.mode == "raises" and not action.text.strip():
            raise ValueError("empty")
        if self.mode == "reward":
            return (), float("nan"), True, False, {}
        if self.mode == "flags":
            return (), 0.0, 1, False, {}
        return (), 0.0, True, False, {}


@pytest.mark.parametrize(
    "mode, match",
    [
        ("reset", "non-empty tuple of Message"),
        ("nondeterministic", "different observations"),
        ("raises", "bad actions must be answered"),
        ("reward", "finite float"),
        ("flags", "must be bools"),
    ],
)
def test_check_env_catches_contract_breaks(mode, match):
    with pytest.raises(EnvContractError, match=match):
        agentrl.check_env(_Broken(mode))


def test_gymnasium_bridge_rejects_non_text_actions(gym_bridge):
    env = gymnasium.make("agentrl/exact-answer-v0").unwrapped
    env.reset(seed=1)
    with pytest.raises(ConfigError, match="as a str"):
        env.step(123)
