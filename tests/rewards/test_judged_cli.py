"""From the command line: a judged env trains (per-term step metrics), evaluates (each term reported), and
replays with --rescore: from the run's cache with no judge request, then with another judge. The judges are
the agentrl gateway on loopback serving scripted verdicts (the point is the plumbing)."""

from __future__ import annotations

import json

import pytest

from agentrl._sync import run_sync
from agentrl.metrics import read_metrics
from agentrl.trainers.cli import main as cli_main
from agentrl.trainers.gateway import Gateway, GatewayConfig

from .test_judge import scripted

SERVE = GatewayConfig(max_turns=100_000, max_new_tokens=16)
TINY = ["--group-size", "2", "--groups-per-step", "2", "--rollout.max-new-tokens", "8"]


@pytest.fixture
def terse_model(tok, tmp_path):
    """A tiny model folder that ends every turn at once (its only likely token is the end of turn): the
    random tiny model never stops within a few tokens, so its turns would never reach the env's judge."""
    import torch

    from agentrl.chat import ChatRenderer
    from agentrl.models import tiny_model

    model = tiny_model(tok, seed=0)
    stop = ChatRenderer(tok).stop_token_ids[0]
    hidden = model.config.hidden_size
    model.config.tie_word_embeddings = False
    with torch.no_grad():
        model.model.embed_tokens.weight[:] = torch.nn.functional.one_hot(torch.tensor(0), hidden).float()
        for layer in model.model.layers:  # the residual stream stays the one embedding every token has
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        head = torch.zeros(model.config.vocab_size, hidden)
        head[stop, 0] = 10.0  # after the final norm the stream is 8 * e0: the stop logit is 80, the rest 0
        model.lm_head = torch.nn.Linear(hidden, model.config.vocab_size, bias=False)
        model.lm_head.weight = torch.nn.Parameter(head)
    folder = tmp_path / "terse"
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


@pytest.fixture
def judges(renderer):
    """Two judges over HTTP (they answer 7/10 and 2/10), served on the background loop while the CLI runs."""
    a = Gateway(scripted(renderer, ["Score: 7"]), renderer, SERVE)
    b = Gateway(scripted(renderer, ["Score: 2"]), renderer, SERVE)
    run_sync(a.__aenter__())
    run_sync(b.__aenter__())
    yield a, b
    run_sync(b.__aexit__(None, None, None))
    run_sync(a.__aexit__(None, None, None))


def test_judged_env_trains_evaluates_and_rescores_from_the_cli(judges, terse_model, tmp_path, capsys):
    a, b = judges
    run = tmp_path / "run"
    url = a.base_url("judge-{uid}")
    judge = ["--reward.judge-url", url, "--reward.temperature", "0.5"]
    args = [
        "train",
        "--env",
        "judged-v0",
        "--model",
        terse_model,
        *TINY,
        *judge,
        "--steps",
        "1",
        "--eval.tasks",
        "0",
    ]
    assert cli_main([*args, "--out", str(run), "--no-progress"]) == 0
    (row,) = read_metrics(run)
    assert row["reward/term/judge"] == pytest.approx(0.7) and row["reward/mean"] == pytest.approx(0.7)
    assert row["judge/calls"] + row["judge/cached"] == 4 and row["episodes/infra_failures"] == 0
    trajs = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    calls = [c for t in trajs for term in t["reward_terms"] for c in term["judge_calls"]]
    assert {c["raw"] for c in calls} == {"Score: 7"} and all(c["prompt"] for c in calls)
    sent = len(a.core.policy.calls)
    capsys.readouterr()

    # --rescore replays the answers through a fresh env: every verdict comes from the run's cache
    assert cli_main(["replay", str(run), "--rescore"]) == 0
    assert "rescore: 4 of 4 rewards reproduced" in capsys.readouterr().out
    assert len(a.core.policy.calls) == sent  # no request reached the judge

    # ... and with another judge the same prompts are judged afresh: every reward differs
    assert cli_main(["replay", str(run), "--rescore", "--judge-url", b.base_url("judge-{uid}")]) == 1
    out = capsys.readouterr().out
    assert "rescore: 0 of 4 rewards reproduced" in out and "rescored 0.2" in out

    # eval reports each term (the run's judge, from its cache where the answers repeat)
    ckpt = next((run / "checkpoints").iterdir())
    assert cli_main(["eval", "--model", str(ckpt), "--tasks", "2", "--k", "1"]) == 0
    assert "judge=0.700" in capsys.readouterr().out
