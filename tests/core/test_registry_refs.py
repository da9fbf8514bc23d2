"""Environments named by reference (``path/to/file.py:Class``, ``package.module:Class``) and check_env's
sample episode: what ``--env`` accepts besides a registered id, and the errors that say what was tried."""

import sys
import textwrap

import pytest

import agentrl
from agentrl import Action, Env, Message, StepResult
from agentrl.errors import ConfigError, EnvContractError, EnvNotFoundError
from agentrl.registry import canonical_env, env_slug

ENV_FILE = textwrap.dedent(
    """
    import agentrl
    from agentrl import Env, Message, StepResult


    class Parrot(Env):
        def __init__(self, word="kiwi"):
            self.word = word

        async def reset(self, *, seed=None, options=None):
            self.seed(seed)
            self.n = self.rng.randint(1, 9)
            return (Message("user", f"Say {self.word} {self.n}"),), {}

        async def step(self, action):
            return StepResult(reward=float(action.text == f"{self.word} {self.n}"), terminated=True)

        def sample_actions(self):
            return (f"{self.word} {self.n}",)


    class NotAnEnv:
        pass

    """
)


@pytest.fixture
def env_file(tmp_path):
    path = tmp_path / "my_envs.py"
    path.write_text(ENV_FILE)
    return path


def test_file_reference_builds_the_class_and_records_an_absolute_path(env_file, tmp_path, monkeypatch):
    # an id the file registers on import is reachable through the file too (unique: files load once)
    env_file.write_text(ENV_FILE + f"\nagentrl.register('parrot-{tmp_path.name}-v0', Parrot)\n")
    monkeypatch.chdir(tmp_path)
    env = agentrl.make("my_envs.py:Parrot", word="fig")
    assert type(env).__name__ == "Parrot" and env.word == "fig" and env.spec_id == "my_envs.py:Parrot"
    agentrl.check_env(env)
    ref = canonical_env("my_envs.py:Parrot")
    assert ref == f"{env_file.resolve()}:Parrot"
    assert env_slug(ref) == "Parrot"
    monkeypatch.chdir("/")  # the recorded form works from anywhere, and the file is imported once
    assert type(agentrl.make(ref)) is type(env)
    assert type(agentrl.make(f"{env_file}:parrot-{tmp_path.name}-v0")) is type(env)


def test_module_reference(env_file, monkeypatch):
    monkeypatch.syspath_prepend(str(env_file.parent))
    sys.modules.pop("my_envs", None)
    env = agentrl.make("my_envs:Parrot")
    assert type(env).__name__ == "Parrot"
    assert canonical_env("my_envs:Parrot") == "my_envs:Parrot"
    sys.modules.pop("my_envs", None)


@pytest.mark.parametrize(
    "ref, exc, match",
    [
        ("nope-v0", EnvNotFoundError, r"no environment registered as 'nope-v0'.*path/to/file\.py:Class"),
        ("missing/file.py:Env", ConfigError, r"read as file:Name; tried to load the file .*does not exist"),
        ("no_such_pkg_xyz.mod:Env", ConfigError, r"read as module:Name; tried to import the module"),
        (
            "{f}:Nope",
            ConfigError,
            r"defines no 'Nope' and registers no such id \(Env classes there: \['Parrot'\]",
        ),
        ("{f}:NotAnEnv", ConfigError, "is a class but not a subclass of agentrl.Env"),
    ],
)
def test_bad_references_say_what_was_tried(env_file, ref, exc, match):
    with pytest.raises(exc, match=match):
        agentrl.make(ref.format(f=env_file))


def test_a_file_that_raises_on_import(tmp_path):
    bad = tmp_path / "broken_env.py"
    bad.write_text("raise RuntimeError('boom at import')\n")
    with pytest.raises(ConfigError, match=r"importing the file .*broken_env\.py' raised RuntimeError: boom"):
        agentrl.make(f"{bad}:X")


def test_a_factory_that_returns_something_else(tmp_path):
    f = tmp_path / "factory_env.py"
    f.write_text("def make_env():\n    return 42\n")
    with pytest.raises(EnvContractError, match=r"returned int, not an agentrl\.Env"):
        agentrl.make(f"{f}:make_env")


class _Graded(Env):
    """An env whose sample answer exposes a broken grader or tool."""

    def __init__(self, broken: str = ""):
        self.broken = broken

    async def reset(self, *, seed=None, options=None):
        self.seed(seed)
        return (Message("user", f"say yes (task {self.rng.randrange(1000)})"),), {}

    async def step(self, action):
        if self.broken == "raises" and action.text == "yes":
            raise RuntimeError("grader crashed")
        reward = 0.0 if self.broken == "zero" else float(action.text == "yes")
        return StepResult(reward=reward, terminated=True)

    def sample_actions(self):
        return ("yes",) if self.broken != "long" else ("yes", "again")


@pytest.mark.parametrize(
    "broken, match",
    [
        ("zero", r"sample actions \(a right answer\) scored 0.0"),
        ("raises", "environment error: _Graded.step raised RuntimeError: grader crashed"),
        ("long", "the episode ended after sample action 0 of 2"),
    ],
)
def test_check_env_plays_the_sample_episode(broken, match):
    agentrl.check_env(_Graded())
    with pytest.raises(EnvContractError, match=match):
        agentrl.check_env(_Graded(broken))


async def test_parrot_sample_is_right(env_file):
    env = agentrl.make(f"{env_file}:Parrot")
    await env.reset(seed=3)
    (answer,) = env.sample_actions()
    assert (await env.step(Action(answer))).reward == 1.0


def test_cli_names_what_was_tried(tmp_path, capsys):
    from agentrl.trainers.cli import main as cli_main

    assert cli_main(["check", "--env", str(tmp_path / "nope.py:MyEnv"), "--no-gymnasium"]) == 2
    err = capsys.readouterr().err
    assert "agentrl check: error:" in err and "nope.py does not exist" in err
    out = tmp_path / "run"
    assert cli_main(["train", "--model", "tiny", "--env", "no_such_mod_q:Env", "--out", str(out)]) == 2
    assert "tried to import the module 'no_such_mod_q'" in capsys.readouterr().err
    assert not out.exists()


def test_cli_check_runs_both_checkers(env_file, capsys):
    from agentrl.trainers.cli import main as cli_main

    assert cli_main(["check", "--env", f"{env_file}:Parrot", "--env-kwargs", '{"word": "fig"}']) == 0
    out = capsys.readouterr().out
    assert "agentrl check_env passed" in out and "Gymnasium check_env passed" in out
