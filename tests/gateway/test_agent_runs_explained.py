"""What ``train --agent`` runs tell the user (issue 47, points 4 and 5), from the command line.

The agent here caps its own turns with ``max_tokens=8`` below ``--rollout.max-new-tokens 24`` and reads its
tasks from a ``.jsonl`` file: the token-limit warning must name the agent's limit, and ``replay --reexec``
must say why an agent's records are not re-executed (and what to run instead), not fail on the task file.
"""

import json
import textwrap

import pytest

from agentrl.trainers.cli import main as cli_main

AGENT = """
import openai

async def solve(task, base_url):
    client = openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0)
    try:
        await client.chat.completions.create(model="policy", messages=list(task.messages), max_tokens=8)
    finally:
        await client.close()
    return 0.0
"""


@pytest.mark.slow
def test_an_agent_run_names_its_own_token_limit_and_is_not_re_executed(tmp_path, capsys):
    (tmp_path / "short_agent.py").write_text(textwrap.dedent(AGENT))
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(
        "".join(json.dumps({"prompt": f"What is {n} + {n}?", "answer": 2 * n}) + "\n" for n in (1, 2))
    )
    run = tmp_path / "run"
    argv = [
        "train",
        "--agent",
        f"{tmp_path / 'short_agent.py'}:solve",
        "--env",
        str(tasks),
        "--model",
        "tiny",
    ]
    argv += ["--steps", "1", "--group-size", "2", "--groups-per-step", "1", "--rollout.max-new-tokens", "24"]
    argv += ["--eval.tasks", "0", "--no-progress", "--out", str(run)]
    assert cli_main(argv) == 0
    err = capsys.readouterr().err
    # The random tiny model never stops by itself: every turn is cut, at the agent's 8 tokens.
    assert "2 of 2 episodes ended at a token limit (2 cut mid-turn at the agent's own max_tokens=8" in err, (
        err
    )
    assert "raise max_tokens in the agent" in err and "Raise --rollout.max-new-tokens" not in err

    assert cli_main(["replay", str(run), "--reexec", "--rescore"]) == 3
    out = capsys.readouterr().out
    assert "no environment registered" not in out
    assert "NOT RE-EXECUTABLE: an agent drove this episode through the gateway" in out
    assert "--check (token fidelity)" in out and "NOT RE-EXECUTABLE: as above" in out
    assert (
        "reexec: 0 of 2 trajectories replayed identically, 0 differed or failed, 2 not re-executable" in out
    )
    # What it points to instead works on the same run.
    assert cli_main(["replay", str(run), "--check"]) == 0
