"""From the command line: a judged env trains (per-term step metrics), evaluates (each term reported), and
replays with --rescore: from the run's cache with no judge request, then with another judge (a URL, or another
rubric file); a group-judged run (--reward.relative-judge) the same way. The judges are the agentrl gateway on
loopback serving scripted verdicts on its session-less route (the point is the plumbing)."""

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
    url = f"{a.url}/v1"
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
    assert cli_main(["replay", str(run), "--rescore", "--judge-url", f"{b.url}/v1"]) == 1
    out = capsys.readouterr().out
    assert "rescore: 0 of 4 rewards reproduced" in out and "rescored 0.2" in out

    # eval reports each term (the run's judge, from its cache where the answers repeat)
    ckpt = next((run / "checkpoints").iterdir())
    assert cli_main(["eval", "--model", str(ckpt), "--tasks", "2", "--k", "1"]) == 0
    assert "judge=0.700" in capsys.readouterr().out
    # ... and another judge's URL: judge B, asked with the run's settings (its temperature 0.5)
    evaluate = ["eval", "--model", str(ckpt), "--tasks", "2", "--k", "1", "--reward.judge-url", f"{b.url}/v1"]
    assert cli_main(evaluate) == 0
    assert "judge=0.200" in capsys.readouterr().out


def _train(run, model, *reward: str) -> None:
    args = ["train", "--env", "judged-v0", "--model", model, *TINY, "--steps", "1", "--eval.tasks", "0"]
    assert cli_main([*args, *reward, "--reward.temperature", "0.5", "--out", str(run), "--no-progress"]) == 0


@pytest.fixture
def group_judges(renderer):
    """Two group judges over HTTP: A ranks the first answer 7 and the second 2, B the other way round."""
    serve = GatewayConfig(max_turns=100_000, max_new_tokens=64)
    a = Gateway(scripted(renderer, ["Answer 1: 7\nAnswer 2: 2"]), renderer, serve)
    b = Gateway(scripted(renderer, ["Answer 1: 2\nAnswer 2: 7"]), renderer, serve)
    run_sync(a.__aenter__())
    run_sync(b.__aenter__())
    yield a, b
    run_sync(b.__aexit__(None, None, None))
    run_sync(a.__aexit__(None, None, None))


def test_a_group_judged_run_trains_rescores_and_evaluates_from_the_cli(
    group_judges, terse_model, tmp_path, capsys
):
    a, b = group_judges
    run = tmp_path / "run"
    _train(run, terse_model, "--reward.judge-url", f"{a.url}/v1", "--reward.relative-judge", "true")
    (row,) = read_metrics(run)
    assert row["reward/term/relative"] == pytest.approx(0.45) and row["reward/mean"] == pytest.approx(0.45)
    assert row["judge/calls"] == len(a.core.policy.calls) > 0  # a group's one call counted once
    assert row["episodes/infra_failures"] == 0 and not a.core.sessions
    trajs = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(t["reward"] for t in trajs) == pytest.approx([0.2, 0.2, 0.7, 0.7])
    for t in trajs:
        (term,) = t["reward_terms"]
        assert term["name"] == "relative" and term["judge_calls"][0]["raw"].startswith("Answer 1: 7")
    sent = len(a.core.policy.calls)
    capsys.readouterr()

    # --rescore re-judges each group from the record: the same prompts, answered from the run's cache
    assert cli_main(["replay", str(run), "--rescore"]) == 0
    assert "rescore: 4 of 4 rewards reproduced" in capsys.readouterr().out
    assert len(a.core.policy.calls) == sent
    # ... and another group judge, ranking the other way, changes every reward
    assert cli_main(["replay", str(run), "--rescore", "--judge-url", f"{b.url}/v1"]) == 1
    assert "rescore: 0 of 4 rewards reproduced" in capsys.readouterr().out and b.core.policy.calls

    # eval judges each task's k answers as a group, as training did
    ckpt = next((run / "checkpoints").iterdir())
    assert cli_main(["eval", "--model", str(ckpt), "--tasks", "2", "--k", "2"]) == 0
    assert "relative=0.450" in capsys.readouterr().out
    # ... and with another judge's URL it stays a group judge, as training built it (judge B ranks the groups)
    sent = len(b.core.policy.calls)
    evaluate = ["eval", "--model", str(ckpt), "--tasks", "2", "--k", "2", "--reward.judge-url", f"{b.url}/v1"]
    assert cli_main(evaluate) == 0
    assert "relative=0.450" in capsys.readouterr().out and len(b.core.policy.calls) == sent + 2


def test_a_rubric_run_is_rejudged_with_another_rubric_file(judges, terse_model, tmp_path, capsys):
    a, b = judges

    def rubric(gw: Gateway):
        path = tmp_path / f"rubric-{gw.port}.json"
        judge = {"base_url": f"{gw.url}/v1", "model": "judge", "temperature": 0.5}
        criteria = [
            {"name": "vivid", "weight": 0.5, "description": "is vivid"},
            {"name": "brief", "weight": 0.5, "function": "brief"},
        ]
        path.write_text(json.dumps({"judge": judge, "criteria": criteria}))
        return str(path)

    run = tmp_path / "run"
    _train(run, terse_model, "--reward.rubric", rubric(a))
    assert read_metrics(run)[0]["reward/term/vivid"] == pytest.approx(0.7)
    capsys.readouterr()
    assert cli_main(["replay", str(run), "--rescore"]) == 0
    assert "rescore: 4 of 4 rewards reproduced" in capsys.readouterr().out
    # another rubric file straight from the command line (no --env-kwargs): judge B's 2/10 instead of 7/10
    assert cli_main(["replay", str(run), "--rescore", "--judge-rubric", rubric(b)]) == 1
    out = capsys.readouterr().out
    assert "rescore: 0 of 4 rewards reproduced" in out and "rescored 0.1" in out
    # a URL cannot stand in for a rubric's judges: the error says what to use instead
    assert cli_main(["replay", str(run), "--rescore", "--judge-url", f"{b.url}/v1"]) == 2
    assert "--judge-rubric" in capsys.readouterr().err
