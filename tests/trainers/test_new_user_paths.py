"""Documented command lines a new user runs first (issue #32), through the CLI's ``main(argv)``:
``train --agent FILE.py:FUNC --env tasks.jsonl`` (relative and absolute paths), and ``eval --model RUN``
without ``--env`` (the env and rollout limits come from the run's config.json)."""

from __future__ import annotations

import json
import re
import textwrap

import pytest

from agentrl import read_trajectories
from agentrl.trainers.cli import main
from agentrl.trainers.evaluate import run_settings
from agentrl.trainers.train_setup import TrainConfig, needs_sandbox

FAST = ["--model", "tiny", "--group-size", "2", "--groups-per-step", "1", "--steps", "1", "--no-progress"]

AGENT = textwrap.dedent(
    '''
    """A tiny agent against the openai client: one turn, reward 1 if the reply mentions the task's word."""
    import openai


    async def solve(task, base_url):
        client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
        try:
            reply = await client.chat.completions.create(model="policy", messages=list(task.messages))
        finally:
            await client.close()
        return float(task.info["word"] in (reply.choices[0].message.content or ""))
    '''
)


def _task_file(folder):
    lines = [{"prompt": "Say hello.", "word": "hello"}, {"prompt": "Say yes.", "word": "yes"}]
    (folder / "tasks.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    (folder / "agent.py").write_text(AGENT)


def test_an_agent_on_a_jsonl_task_file_needs_no_sandbox(tmp_path):
    _task_file(tmp_path)
    cfg = TrainConfig(model="tiny", agent=f"{tmp_path}/agent.py:solve", env=str(tmp_path / "tasks.jsonl"))
    assert not needs_sandbox(cfg)  # it used to look the file up as an env id and fail


@pytest.mark.slow
@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_train_an_agent_on_a_jsonl_task_file(tmp_path, monkeypatch, capsys, where):
    _task_file(tmp_path)
    monkeypatch.chdir(tmp_path)
    tasks = "tasks.jsonl" if where == "relative" else str(tmp_path / "tasks.jsonl")
    argv = ["train", *FAST, "--agent", "agent.py:solve", "--env", tasks, "--rollout.max-new-tokens", "8"]
    assert main([*argv, "--out", "run"]) == 0, capsys.readouterr().err
    trajs = list(read_trajectories(tmp_path / "run"))
    assert len(trajs) == 2 and all(t.meta.extra["source"] == "gateway" for t in trajs)
    assert all(t.meta.task_id.startswith(f"{tasks}:") for t in trajs)
    assert not any(t.infra_failure for t in trajs)


def _fake_run(folder):
    folder.mkdir()
    config = {
        "model": "tiny",
        "env": "calculator-v0",
        "env_kwargs": {"digits": 2},
        "agent": None,
        "rollout": {
            "max_turns": 2,
            "max_new_tokens": 12,
            "max_total_tokens": 512,
            "temperature": 0.7,
        },
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_run_settings_come_from_the_run_or_its_checkpoints(tmp_path):
    run = _fake_run(tmp_path / "run")
    ckpt = run / "checkpoints" / "step-000001" / "model"
    ckpt.mkdir(parents=True)
    (ckpt / "config.json").write_text('{"model_type": "llama"}')  # a Hugging Face folder's own config
    for model in (run, run / "checkpoints" / "step-000001", ckpt):
        s = run_settings(str(model))
        assert s is not None and s.run == run
        assert (s.env, s.env_kwargs, s.max_turns, s.max_new_tokens) == ("calculator-v0", {"digits": 2}, 2, 12)
        assert (s.max_total_tokens, s.temperature) == (512, 0.7)
    assert run_settings("tiny") is None and run_settings(str(tmp_path)) is None


def test_eval_of_an_agent_on_a_task_file_asks_for_an_env(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text(json.dumps({"env": "tasks.jsonl", "agent": "a.py:solve"}))
    assert main(["eval", "--model", str(run), "--tasks", "1", "--k", "1"]) == 2
    assert "pass --env ID" in capsys.readouterr().err
    assert main(["eval", "--model", "tiny", "--tasks", "1", "--k", "1"]) == 2
    assert "--env is required unless --model is a training run" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_a_run_without_env(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["train", *FAST, "--env", "calculator-v0", "--env-kwargs", '{"digits": 2}', "--eval.tasks", "0"]
    argv += ["--rollout.max-new-tokens", "8", "--rollout.max-turns", "2", "--out", str(run)]
    assert main(argv) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["eval", "--model", str(run), "--tasks", "2", "--k", "1", "--json"]) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["env"] == "calculator-v0" and report["episodes"] == 2
    assert f"from {run / 'config.json'}: env calculator-v0, max_turns 2, max_new_tokens 8" in err


def test_help_names_the_real_default_env_and_envs_describes_each(capsys):
    from agentrl.trainers.cli import build_parser

    help_text = re.sub(r"-\s+", "-", " ".join(build_parser().format_help().split()))  # argparse wraps at "-"
    assert "SmolLM2-135M on math-tir-arith-v0 with OTB" in help_text
    assert main(["envs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    listed = {line.split()[0]: line for line in lines}
    assert "calculator-v0" in listed and "word problem" in listed["calculator-v0"]
    assert "kinds=('arithmetic',)" in listed["math-tir-arith-v0"]  # what the id fixes
    shipped = [
        "calculator-v0",
        "code-tests-v0",
        "exact-answer-v0",
        "guess-number-v0",
        "math-tir-v0",
        "shop-v0",
    ]
    assert all(len(listed[env_id].split()) > 3 for env_id in shipped)  # each with its description


BAD_TOOL_ENV = textwrap.dedent(
    '''
    from agentrl.envs import Task, ToolEnv
    from agentrl.tools import tool


    @tool
    def shout(text: str) -> str:
        """
        Args:
            text: What to shout.
        """
        return text.upper()


    class ShoutEnv(ToolEnv):
        """Shout a word."""

        def __init__(self, **kwargs):
            super().__init__([shout], **kwargs)

        def make_task(self, options):
            return Task("Shout hello.", answer="HELLO")
    '''
)


def test_a_tool_without_a_docstring_summary_is_named_as_such(tmp_path, capsys):
    (tmp_path / "shout_env.py").write_text(BAD_TOOL_ENV)
    assert main(["check", "--env", f"{tmp_path}/shout_env.py:ShoutEnv", "--no-gymnasium"]) == 2
    err = capsys.readouterr().err
    assert "tool 'shout' has a docstring without a summary" in err, err
    assert "no description for the argument" not in err
