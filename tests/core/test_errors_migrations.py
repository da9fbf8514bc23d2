"""Code written for the previous release gets a migration message, not a bare TypeError/ImportError, at each
of the five places that release broke (CHANGELOG.md, "2026-11-26")."""

import dataclasses
import inspect
import re
from pathlib import Path

import pytest

import agentrl
from agentrl import TrajectoryGroup
from agentrl.errors import ConfigError, EnvNotFoundError, MigrationError, MovedError
from agentrl.rollout import RolloutConfig, collect
from agentrl.testing import EchoEnv, ScriptedPolicy

CHANGELOG = Path(__file__).resolve().parents[2] / "CHANGELOG.md"


def test_tool_env_max_turns_says_the_turn_limit_is_the_rollouts():
    from agentrl.envs.tool_env import ToolEnv

    class OldEnv(ToolEnv):  # as an env of the previous release wrote it
        def __init__(self):
            super().__init__([], max_turns=4)

        def make_task(self, options):
            raise AssertionError("never reached")

    with pytest.raises(
        MigrationError, match=r"OldEnv: the max_turns= argument was removed.*--rollout\.max-turns"
    ):
        OldEnv()
    with pytest.raises(TypeError):  # what `except TypeError` caught before still catches it
        OldEnv()
    # Through the registry (agentrl train --env_kwargs '{"max_turns": 4}'), the same message.
    with pytest.raises(ConfigError, match=r"max_turns= argument was removed.*--rollout\.max-turns"):
        agentrl.make("math-tir-v0", max_turns=4)
    # Other unknown arguments still get Python's own error, and the signature is the real one.
    with pytest.raises(TypeError, match="unexpected keyword argument 'max_turn'") as e:
        ToolEnv.__init__(object.__new__(OldEnv), [], max_turn=4)
    assert not isinstance(e.value, MigrationError)
    assert "max_turns" not in inspect.signature(ToolEnv).parameters


def test_rollout_config_sampling_says_where_its_fields_went():
    with pytest.raises(
        MigrationError, match=r"RolloutConfig: the sampling= argument was removed.*temperature="
    ):
        RolloutConfig(sampling=object())
    # The decorated dataclass is the same dataclass: signature, replace, validation.
    params = inspect.signature(RolloutConfig).parameters
    assert "sampling" not in params and params["max_turns"].default == 8
    cfg = dataclasses.replace(RolloutConfig(), max_turns=3, temperature=0.5)
    assert (cfg.max_turns, cfg.sampling.temperature) == (3, 0.5)
    with pytest.raises(ConfigError):
        RolloutConfig(max_turns=0)


async def test_collect_returns_groups_and_a_trajectory_attribute_on_one_says_so(renderer):
    stop = renderer.stop_token_ids
    policy = ScriptedPolicy([[*renderer.encode("apple"), stop[0]]] * 4, stop_ids=stop)
    result = await collect(
        EchoEnv, policy, renderer, n_groups=2, group_size=2, config=RolloutConfig(max_turns=2)
    )
    assert all(isinstance(g, TrajectoryGroup) for g in result)
    old_style = result[0]  # code of the previous release took each item for a Trajectory
    for name in ("reward", "token_ids", "meta"):
        with pytest.raises(
            AttributeError, match=rf"{name} is a Trajectory's.*\[t for g in groups for t in g\]"
        ):
            getattr(old_style, name)
    assert [t.reward for g in result for t in g] == [t.reward for t in (*result[0], *result[1])]
    # A name that was never a Trajectory's gets the plain error; a group's own attributes work.
    with pytest.raises(AttributeError) as e:
        old_style.no_such_thing  # noqa: B018
    assert str(e.value) == "'TrajectoryGroup' object has no attribute 'no_such_thing'"
    assert not hasattr(old_style, "__wrapped__") and len(old_style.rewards) == 2


def test_replay_reexec_names_its_new_home():
    from agentrl import replay
    from agentrl.replay import _MOVED_TO_TRAINERS
    from agentrl.trainers import replay as trainers_replay

    with pytest.raises(MovedError, match=r"from agentrl\.trainers\.replay import reexec"):
        from agentrl.replay import reexec
    with pytest.raises(ImportError, match=r"agentrl\.replay\.rescore moved to agentrl\.trainers\.replay"):
        replay.rescore  # noqa: B018
    # The compatibility idiom works.
    try:
        from agentrl.replay import reexec
    except ImportError:
        from agentrl.trainers.replay import reexec
    assert reexec is trainers_replay.reexec
    # Every name the message points at is really there.
    assert set(trainers_replay.__all__) >= _MOVED_TO_TRAINERS
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        replay.nope  # noqa: B018


def test_a_gymnasium_id_given_to_agentrl_make_says_how_to_register():
    with pytest.raises(EnvNotFoundError, match=r"agentrl\.make takes 'math-tir-v0'.*register_gymnasium"):
        agentrl.make("agentrl/math-tir-v0")


def test_the_changelog_lists_each_break_with_its_migration():
    text = CHANGELOG.read_text()
    section = text.split("## 2026-11-26", 1)[1].split("\n## ", 1)[0]
    for marker in (
        "ToolEnv(max_turns=",
        "RolloutConfig(sampling=",
        "collect()",
        "agentrl.replay.reexec",
        "Gymnasium",
    ):
        entry = next((e for e in re.split(r"\n- ", section) if marker in e), None)
        assert entry is not None and "*Migration:*" in entry, marker


def test_every_shim_names_the_release_that_removes_it():
    from agentrl.errors import SHIMS_REMOVED_IN

    gone = re.escape(f"goes in agentrl {SHIMS_REMOVED_IN}")
    with pytest.raises(MigrationError, match=gone):
        RolloutConfig(sampling=object())
    with pytest.raises(MovedError, match=gone):
        from agentrl.replay import reexec  # noqa: F401
    text = CHANGELOG.read_text()
    section = text.split(f"### Migration shims: each goes in agentrl {SHIMS_REMOVED_IN}\n", 1)[1]
    section = section.split("\n## ", 1)[0]
    for marker in (
        "ToolEnv(max_turns=)",
        "RolloutConfig(sampling=)",
        "agentrl.replay import reexec",
        "TrajectoryGroup",
        "TrainConfig(ray=",
        "RayOptions(weights=",
        "agentrl.samples.episodes_of",
        "agentrl.trainers.pg",
        "agentrl.trainers.distributed",
    ):
        assert marker in section, marker
