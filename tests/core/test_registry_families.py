"""Env families (``register_family``): ``prefix:<name>`` references, with the member name as a keyword
argument, lazily loaded entry points and name lists, and the listing that imports no wrapped library."""

import subprocess
import sys

import pytest

import agentrl
from agentrl import Action, Env, Message, StepResult
from agentrl.errors import ConfigError, EnvNotFoundError
from agentrl.registry import canonical_env, env_slug, family_names, list_families, register_family


class Say(Env):
    """Ask the model to say one word; reward 1 when it does."""

    def __init__(self, word: str, times: int = 1):
        self.word, self.times = word, times

    async def reset(self, *, seed=None, options=None):
        self.seed(seed)
        return (Message("user", f"say {self.word} {self.times} times"),), {}

    async def step(self, action: Action) -> StepResult:
        return StepResult(reward=float(action.text == " ".join([self.word] * self.times)), terminated=True)


def test_a_member_is_built_with_its_name_and_the_callers_kwargs():
    register_family("test-say", Say, arg="word", names=lambda: ["hello", "bye"])
    env = agentrl.make("test-say:hello", times=2)
    assert isinstance(env, Say) and (env.word, env.times) == ("hello", 2)
    assert env.spec_id == "test-say:hello"
    assert agentrl.registry.spec("test-say:bye").defaults == {"word": "bye"}
    assert family_names("test-say") == ["bye", "hello"]
    assert "test-say" in [f.prefix for f in list_families()]
    # A run records a member as it is and names its folder after the whole reference.
    assert canonical_env("test-say:hello") == "test-say:hello"
    assert env_slug("test-say:hello") == "test-say_hello"


def test_string_entry_points_and_name_lists_load_lazily():
    register_family("test-guess", "agentrl.envs.guess_number:GuessNumberEnv", arg="high")
    assert family_names("test-guess") == []  # a family need not enumerate its members
    with pytest.raises(ConfigError, match="integers"):  # the member name is passed on as it is
        agentrl.make("test-guess:ten")


def test_bad_registrations_and_references_are_refused_with_the_reason():
    register_family("test-one", Say, arg="word")
    register_family("test-one", Say, arg="word")  # the same again is fine
    with pytest.raises(ConfigError, match="already registered"):
        register_family("test-one", "agentrl.testing:EchoEnv", arg="word")
    with pytest.raises(ConfigError, match="prefix"):
        register_family("bad/prefix", Say, arg="word")
    with pytest.raises(ConfigError, match="keyword argument"):
        register_family("test-two", Say, arg="not an identifier")
    with pytest.raises(ConfigError, match="names no member"):
        agentrl.make("test-one:")
    with pytest.raises(EnvNotFoundError, match="no env family"):
        family_names("no-such-family")


def test_module_references_still_work_beside_families():
    # 'agentrl.testing:EchoEnv' is a module reference: no family has the prefix 'agentrl.testing'.
    assert type(agentrl.make("agentrl.testing:EchoEnv")).__name__ == "EchoEnv"


@pytest.mark.slow  # a fresh interpreter imports agentrl and torch
def test_listing_families_imports_none_of_the_wrapped_libraries():
    """`agentrl envs` lists the shipped families from their docstrings; reasoning-gym and textarena are
    imported only when a member is made or `agentrl envs FAMILY` lists the members."""
    code = (
        "import sys\n"
        "from agentrl.trainers.cli import main\n"
        "assert main(['envs']) == 0\n"
        "assert 'reasoning_gym' not in sys.modules and 'textarena' not in sys.modules, 'imported'\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "reasoning-gym:<dataset>" in out.stdout and "textarena:<game>" in out.stdout
    assert "agentrl envs reasoning-gym lists them" in out.stdout
