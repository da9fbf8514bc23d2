"""The tool-call format has one owner, the env's own ``tool_format`` argument (``env_kwargs``):
``--rollout.tool-format`` sets it (by name, or ``auto`` from the model's chat template), an earlier run's
``rollout.tool_format`` loads into it, the run records it, and ``replay --reexec`` builds the env with it
again."""

import json

import pytest

import agentrl
from agentrl.config import config_from_dict
from agentrl.errors import ConfigError, MigrationError
from agentrl.rollout import RolloutConfig
from agentrl.run import RunDir
from agentrl.trainers.cli import _train_config, build_parser
from agentrl.trainers.cli import main as cli_main
from agentrl.trainers.evaluate import run_settings
from agentrl.trainers.factories import env_arguments
from agentrl.trainers.train import TrainConfig


def cfg(env: str, fmt: str | None, *argv: str) -> TrainConfig:
    """The config ``agentrl train --env ENV [--rollout.tool-format FMT] ARGV`` runs with."""
    flag = ["--rollout.tool-format", fmt] if fmt is not None else []
    return _train_config(build_parser().parse_args(["train", "--model", "tiny", "--env", env, *flag, *argv]))


def test_the_flag_sets_the_env_s_own_argument_for_tool_envs_only():
    c = cfg("calculator-v0", "mistral", "--env-kwargs", '{"digits": 3}')
    assert c.env_kwargs == {"digits": 3, "tool_format": "mistral"}  # its one home
    assert env_arguments(c) == {"digits": 3, "tool_format": "mistral"}
    assert agentrl.make("calculator-v0", **env_arguments(c)).parser.name == "mistral"
    assert cfg("guess-number-v0", "mistral").env_kwargs == {}  # not a ToolEnv: nothing to hand over
    assert env_arguments(cfg("calculator-v0", None)) == {}
    with pytest.raises(ConfigError, match=r"--rollout.tool-format 'klingon': unknown"):
        cfg("calculator-v0", "klingon")
    with pytest.raises(ConfigError, match=r"--rollout.tool-format 'klingon': unknown"):
        TrainConfig(model="tiny", env="calculator-v0", env_kwargs={"tool_format": "klingon"})
    # SmolLM2's chat template renders no tool calls, so auto cannot choose for it: a clear error.
    with pytest.raises(ConfigError, match="renders no tool-call format agentrl knows"):
        env_arguments(cfg("calculator-v0", "auto"))
    # The rollout config no longer holds it; Python code that passed it there is told where it went.
    with pytest.raises(MigrationError, match=r"tool_format= argument was removed.*env's own argument"):
        RolloutConfig(tool_format="mistral")


def test_an_earlier_config_json_loads_with_the_format_in_env_kwargs(tmp_path):
    earlier = {"model": "tiny", "env": "calculator-v0", "rollout": {"max_turns": 2, "tool_format": "mistral"}}
    c = config_from_dict(TrainConfig, earlier)
    assert (c.env_kwargs, c.rollout.max_turns) == ({"tool_format": "mistral"}, 2)
    assert not hasattr(c.rollout, "tool_format")
    # Through a run directory, as eval, resume and replay read it; the rewritten file has one home.
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.config_path.write_text(json.dumps({**earlier, "env_kwargs": {"digits": 2}}))
    c = run.read_config(TrainConfig)
    assert c.env_kwargs == {"digits": 2, "tool_format": "mistral"}
    assert run_settings(str(run.path)).env_kwargs == {"digits": 2, "tool_format": "mistral"}  # agentrl eval
    run.write_config(c)
    saved = json.loads(run.config_path.read_text())
    assert saved["env_kwargs"]["tool_format"] == "mistral" and "tool_format" not in saved["rollout"]
    # None (every run that named no format) and a non-ToolEnv's format (never handed over) are dropped.
    for env, fmt in (("calculator-v0", None), ("guess-number-v0", "auto")):
        loaded = config_from_dict(TrainConfig, {"env": env, "rollout": {"tool_format": fmt}})
        assert loaded.env_kwargs == {}, (env, fmt)
    # The same format in both is one format; two different ones are refused, naming both.
    both = {**earlier, "env_kwargs": {"tool_format": "mistral"}}
    assert config_from_dict(TrainConfig, both).env_kwargs == {"tool_format": "mistral"}
    with pytest.raises(
        ConfigError, match=r"rollout.tool_format mistral and --env-kwargs tool_format 'hermes'"
    ):
        config_from_dict(TrainConfig, {**earlier, "env_kwargs": {"tool_format": "hermes"}})


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
    assert recorded["env_kwargs"]["tool_format"] == "llama3_json" and "tool_format" not in recorded["rollout"]
    assert env_arguments(RunDir(out).read_config(TrainConfig)) == {"tool_format": "llama3_json"}
    capsys.readouterr()
    assert cli_main(["replay", str(out), "--reexec"]) == 0


def test_env_kwargs_may_not_contradict_the_format():
    # Issue 47: --env-kwargs used to override --rollout.tool-format silently (and config.json kept both).
    with pytest.raises(ConfigError, match=r"--rollout.tool-format mistral and --env-kwargs tool_format "):
        cfg("calculator-v0", "mistral", "--env-kwargs", '{"tool_format": "llama3_json"}')
    with pytest.raises(ConfigError, match="contradict"):
        cfg("calculator-v0", "auto", "--env-kwargs", '{"tool_format": "hermes"}')
    # Saying the same thing twice, or once, is fine.
    same = cfg("calculator-v0", "mistral", "--env-kwargs", '{"tool_format": "mistral"}')
    assert env_arguments(same) == {"tool_format": "mistral"}
    assert env_arguments(cfg("calculator-v0", None, "--env-kwargs", '{"tool_format": "hermes"}')) == {
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
    assert json.loads((out / "config.json").read_text())["env_kwargs"]["tool_format"] == "hermes"
