"""``--rollout.tool-format``: the trainer hands a tool-call format to a ToolEnv (by name, or ``auto`` from
the model's chat template), the run records it, and ``replay --reexec`` builds the env with it again."""

import json

import pytest

import agentrl
from agentrl.errors import ConfigError
from agentrl.rollout import RolloutConfig
from agentrl.trainers.cli import main as cli_main
from agentrl.trainers.pg import TrainConfig
from agentrl.trainers.train_setup import env_arguments


def cfg(env: str, fmt: str | None, **kwargs) -> TrainConfig:
    return TrainConfig(model="tiny", env=env, rollout=RolloutConfig(tool_format=fmt), **kwargs)


def test_the_format_reaches_tool_envs_only():
    args = env_arguments(cfg("calculator-v0", "mistral", env_kwargs={"digits": 3}))
    assert args == {"digits": 3, "tool_format": "mistral"}
    assert agentrl.make("calculator-v0", **args).parser.name == "mistral"
    assert env_arguments(cfg("guess-number-v0", "mistral")) == {}  # not a ToolEnv: nothing to hand over
    assert env_arguments(cfg("calculator-v0", None)) == {}
    with pytest.raises(ConfigError, match=r"--rollout.tool-format 'klingon': unknown"):
        cfg("calculator-v0", "klingon")
    # SmolLM2's chat template renders no tool calls, so auto cannot choose for it: a clear error.
    with pytest.raises(ConfigError, match="renders no tool-call format agentrl knows"):
        env_arguments(cfg("calculator-v0", "auto"))


@pytest.mark.slow
def test_a_run_records_the_format_and_replay_uses_it(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["train", "--model", "tiny", "--env", "calculator-v0", "--rollout.tool-format", "llama3_json"]
    argv += ["--group-size", "2", "--groups-per-step", "1", "--rollout.max-new-tokens", "16", "--steps", "1"]
    argv += ["--eval.tasks", "0", "--no-progress", "--out", str(out)]
    assert cli_main(argv) == 0
    (first, *_) = agentrl.read_trajectories(out / "trajectories.jsonl")
    assert "To call one, reply with only a JSON object" in first.messages[0].content  # Llama's instructions
    recorded = json.loads((out / "config.json").read_text())
    assert recorded["rollout"]["tool_format"] == "llama3_json"
    from agentrl.run import RunDir

    assert env_arguments(RunDir(out).read_config(TrainConfig)) == {"tool_format": "llama3_json"}
    capsys.readouterr()
    assert cli_main(["replay", str(out), "--reexec"]) == 0
