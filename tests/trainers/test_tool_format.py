"""``--rollout.tool-format``: the trainer hands a tool-call format to a ToolEnv (by name, or ``auto`` from
the model's chat template), the run records it, and ``replay --reexec`` builds the env with it again."""

import json

import pytest

import agentrl
from agentrl.errors import ConfigError
from agentrl.rollout import RolloutConfig
from agentrl.trainers.cli import main as cli_main
from agentrl.trainers.train import TrainConfig
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


def test_env_kwargs_may_not_contradict_the_format():
    # Issue 47: --env-kwargs used to override --rollout.tool-format silently (and config.json kept both).
    with pytest.raises(ConfigError, match=r"--rollout.tool-format mistral and --env-kwargs tool_format "):
        cfg("calculator-v0", "mistral", env_kwargs={"tool_format": "llama3_json"})
    with pytest.raises(ConfigError, match="contradict"):
        cfg("calculator-v0", "auto", env_kwargs={"tool_format": "hermes"})
    # Saying the same thing twice, or once, is fine.
    assert env_arguments(cfg("calculator-v0", "mistral", env_kwargs={"tool_format": "mistral"})) == {
        "tool_format": "mistral"
    }
    assert env_arguments(cfg("calculator-v0", None, env_kwargs={"tool_format": "hermes"})) == {
        "tool_format": "hermes"
    }
    # From the command line: exit status 2 and the message, before anything is built.
    argv = ["train", "--model", "tiny", "--env", "calculator-v0", "--rollout.tool-format", "mistral"]
    assert cli_main([*argv, "--env-kwargs", '{"tool_format": "llama3_json"}', "--steps", "1"]) != 0


@pytest.fixture(scope="module")
def hermes_model(tmp_path_factory):
    """A tiny model folder whose chat template carries Hermes' ``<tool_call>`` marker."""
    from agentrl.models import smollm2_tokenizer, tiny_model

    folder = tmp_path_factory.mktemp("hermes-model")
    tok = smollm2_tokenizer()
    tiny_model(tok).save_pretrained(folder)
    tok.chat_template = tok.chat_template + "{#- tools render as <tool_call>{...}</tool_call> -#}"
    tok.save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_auto_prints_and_records_the_format_it_chose(tmp_path, capsys, hermes_model):
    out = tmp_path / "run"
    argv = ["train", "--model", str(hermes_model), "--env", "calculator-v0", "--rollout.tool-format", "auto"]
    argv += ["--group-size", "2", "--groups-per-step", "1", "--rollout.max-new-tokens", "8", "--steps", "1"]
    argv += ["--eval.tasks", "0", "--no-progress", "--out", str(out)]
    assert cli_main(argv) == 0
    printed = capsys.readouterr().out
    assert f"--rollout.tool-format auto: hermes (the chat template of {hermes_model} renders it)" in printed
    assert json.loads((out / "config.json").read_text())["rollout"]["tool_format"] == "hermes"
