"""What ``agentrl train`` says about its own decisions, from the command line (issue 47, points 7, 8, 9).

The task source is an env file next to a helper module it imports (``--env file.py:Class`` puts the file's
folder on ``sys.path``, as Python does for a script). The agent's first session fails and every later one
succeeds, so step 0 has signal and step 1 is *solved* (not a collapse); its sessions in step 1 ask for twice
the tokens (the random tiny model never stops early: every turn is cut at its ``max_tokens``), so the
length-triggered schedule decays the rate at step 1, and says so.
"""

import textwrap

import pytest

from agentrl.metrics import read_metrics
from agentrl.trainers.cli import main as cli_main

ENV = """
from agentrl import Env, Message, StepResult
from prompt_words import PROMPT  # beside this file: no PYTHONPATH needed


class PromptEnv(Env):
    async def reset(self, *, seed=None, options=None):
        self.seed(seed)
        return (Message("user", PROMPT),), {}

    async def step(self, action):
        return StepResult(terminated=True)
"""

AGENT = """
import openai

SESSIONS = []


async def solve(task, base_url):
    n = len(SESSIONS)  # the first two sessions are step 0's
    SESSIONS.append(n)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    try:
        await client.chat.completions.create(
            model="policy", messages=list(task.messages), max_tokens=4 if n < 2 else 8
        )
    finally:
        await client.close()
    return 0.0 if n == 0 else 1.0
"""


@pytest.mark.slow
def test_solved_steps_lr_decays_and_env_files_beside_modules(tmp_path, capsys):
    envs = tmp_path / "envs"
    envs.mkdir()
    (envs / "prompt_words.py").write_text('PROMPT = "Say anything."\n')
    (envs / "prompt_env.py").write_text(textwrap.dedent(ENV))
    (tmp_path / "agent.py").write_text(textwrap.dedent(AGENT))
    run = tmp_path / "run"
    argv = [
        "train",
        "--env",
        f"{envs / 'prompt_env.py'}:PromptEnv",
        "--agent",
        f"{tmp_path / 'agent.py'}:solve",
    ]
    argv += ["--model", "tiny", "--steps", "2", "--group-size", "2", "--groups-per-step", "1"]
    argv += ["--rollout.max-new-tokens", "16", "--learner.lr", "1e-3", "--learner.lr-schedule"]
    argv += ["length-triggered", "--learner.lr-window", "1", "--learner.lr-trigger", "1.5"]
    argv += ["--eval.tasks", "0", "--no-progress", "--out", str(run)]
    assert cli_main(argv) == 0
    err = capsys.readouterr().err
    rows = read_metrics(run)
    assert [r["stability/zero_variance_frac"] for r in rows] == [0.0, 1.0]
    assert rows[1]["stability/solved"] == 1.0 and rows[1]["stability/collapsed"] == 0.0
    assert "step 1: solved — every episode got the full reward" in err
    assert "has collapsed" not in err and "training on nothing" not in err
    assert [r["learn/response_length"] for r in rows] == [4.0, 8.0]
    assert rows[1]["learn/lr"] == 5e-4
    assert "step 1: learning rate 0.001 -> 0.0005: the mean response length grew 2.00x" in err
