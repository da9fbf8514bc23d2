"""`agentrl train` end to end on CPU: run directory, finite metrics, resume, kill -9, signals, CLI errors."""

import dataclasses
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl import read_trajectories
from agentrl.config import config_from_args, config_from_dict
from agentrl.credit import GRPO, OTB
from agentrl.errors import ConfigError
from agentrl.metrics import read_metrics
from agentrl.trainers.cli import build_parser
from agentrl.trainers.cli import main as cli_main
from agentrl.trainers.train_setup import TrainConfig, prepare_run, task_seeds
from tests.replay.runs import TINY, TINY_TWO_STEPS, cli_run, private_copy

AGENTRL = [sys.executable, "-m", "agentrl.trainers"]


def run_cli(args, **kw):
    return subprocess.run([*AGENTRL, *args], capture_output=True, text=True, timeout=600, **kw)


def steps_of(run):
    return [r["step"] for r in read_metrics(run)]


@pytest.fixture(scope="module")
def two_step_run(tmp_path_factory):
    """``train *TINY --steps 2`` (``TINY_TWO_STEPS``), trained once per session for this module and
    tests/replay's ``tiny_run``; this module's tests get their own copy, to resume or plot into."""
    assert list(TINY_TWO_STEPS) == ["train", *TINY, "--steps", "2"]
    shared, stdout = cli_run(tmp_path_factory, TINY_TWO_STEPS)
    return private_copy(shared, tmp_path_factory.mktemp("runs") / "r"), stdout


def test_run_directory_and_finite_metrics(two_step_run):
    run, stdout = two_step_run
    assert "step 0:" in stdout and "step 1:" in stdout
    assert {p.name for p in run.iterdir()} >= {
        "config.json",
        "trajectories.jsonl",
        "metrics.jsonl",
        "checkpoints",
    }
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["model"] == "tiny" and cfg["batch"]["group_size"] == 2
    # config.json records the estimator with its options (before typed estimators: "estimator": "otb").
    assert cfg["estimator"] == {"name": "otb", "zero_tail": True, "eps": 1e-8}
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1]
    for r in rows:
        for key in (
            "reward/mean",
            "learn/loss",
            "learn/grad_norm",
            "tokens/model_per_episode",
            "variance/proxy2_total_power",
            "time/rollout_s",
            "time/learn_s",
            "time/publish_s",
        ):
            assert isinstance(r[key], float) and math.isfinite(r[key]), (key, r[key])
    trajs = list(read_trajectories(run))
    assert len(trajs) == 8 and all(not t.infra_failure for t in trajs)
    for t in trajs:
        t.validate()
        assert t.meta.env_id == "math-tir-arith-v0" and t.meta.step in (0, 1)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-000001", "step-000002"]


def test_the_run_ends_with_a_held_out_evaluation_of_untrained_and_trained(two_step_run):
    run, stdout = two_step_run
    report = json.loads((run / "eval.json").read_text())
    assert "bootstrap over tasks" in report["interval"]
    for label in ("untrained", "trained"):
        r = report[label]
        assert r["split"] == "test" and r["tasks"] == 2 and r["samples_per_task"] == 2
        assert r["task_ids"] == ["math-tir-arith-v0:10000", "math-tir-arith-v0:10001"]  # the same tasks
        assert r["pass_at_1_low"] <= r["pass_at_1"] <= r["pass_at_1_high"]
        assert f"held-out eval, {label}" in stdout
    gain = report["gain"]
    assert gain["gain"] == pytest.approx(report["trained"]["pass_at_1"] - report["untrained"]["pass_at_1"])
    assert "held-out pass@1 on 2 test tasks x 2: untrained" in stdout


@pytest.mark.slow  # ~17 s on 2 cores
def test_resume_continues_at_step_3_with_the_same_data(two_step_run, tmp_path, capsys):
    """The resume and the fresh run call the CLI's ``main`` in this process: the run being resumed was
    trained by ``python -m agentrl.trainers`` in another process (the fixture), so what the resume restores
    can only come from the run folder; a fresh interpreter's imports would add nothing to the claim."""
    run, _ = two_step_run
    assert cli_main(["train", "--resume", str(run), "--steps", "3", "--no-progress"]) == 0
    stdout = capsys.readouterr().out
    assert "resumed" in stdout and "step 2:" in stdout and "step 0:" not in stdout
    assert steps_of(run) == [0, 1, 2]
    # The data order is a function of (seed, step): a fresh 3-step run sees the same tasks at step 2.
    fresh = tmp_path / "fresh"
    assert cli_main(["train", *TINY, "--eval.tasks", "0", "--steps", "3", "--out", str(fresh)]) == 0

    def tasks(r, step):
        return sorted({t.meta.task_id for t in read_trajectories(r) if t.meta.step == step})

    assert tasks(run, 2) == tasks(fresh, 2) == sorted(f"math-tir-arith-v0:{s}" for s in task_seeds(0, 2, 2))


def test_resume_refuses_to_change_the_experiment(two_step_run):
    run, _ = two_step_run
    saved = config_from_dict(TrainConfig, json.loads((run / "config.json").read_text()))
    assert saved.estimator == OTB()
    with pytest.raises(ConfigError, match=r"cannot change \['estimator'\]"):
        prepare_run(dataclasses.replace(saved, estimator="grpo", resume=str(run)))
    with pytest.raises(ConfigError, match=r"cannot change \['estimator'\]"):
        prepare_run(dataclasses.replace(saved, estimator=OTB(zero_tail=False), resume=str(run)))


def test_run_dir_from_before_typed_estimators_still_resumes(two_step_run, tmp_path, capsys):
    run, _ = two_step_run
    old = tmp_path / "old"
    shutil.copytree(run, old)
    cfg = json.loads((old / "config.json").read_text())
    cfg["estimator"] = "otb"  # how config.json recorded the estimator before it had options
    cfg["output"]["out"], cfg["output"]["resume"] = str(old), None  # as written by its first run
    (old / "config.json").write_text(json.dumps(cfg))
    steps = steps_of(old)
    # Every step is done: resuming loads the config and the last checkpoint, trains nothing and exits 0.
    assert cli_main(["train", "--resume", str(old), "--steps", str(len(steps)), "--no-progress"]) == 0
    assert f"resumed {old} at step {len(steps)}" in capsys.readouterr().out
    assert json.loads((old / "config.json").read_text())["estimator"]["name"] == "otb"
    assert steps_of(old) == steps


def test_estimator_options_from_the_cli_are_recorded(tmp_path, capsys):
    argv = ["train", "--estimator", "grpo", "--estimator.norm-by-std", "false", "--out", str(tmp_path / "g")]
    cfg, run = prepare_run(config_from_args(TrainConfig, build_parser().parse_args(argv)))
    assert cfg.estimator == GRPO(norm_by_std=False)
    saved = json.loads(run.config_path.read_text())
    assert saved["estimator"] == {"name": "grpo", "norm_by_std": False, "eps": 1e-6}
    assert config_from_dict(TrainConfig, saved) == cfg
    assert cli_main(["train", "--model", "tiny", "--estimator.norm-by-std", "false"]) == 2
    err = capsys.readouterr().err
    assert "--estimator.norm_by_std does not apply to --estimator otb" in err
    assert "its options: --estimator.zero_tail, --estimator.eps" in err


def _wait_for(predicate, timeout=240):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def _lines(path):
    return path.read_text().splitlines() if path.exists() else []


@pytest.mark.slow
def test_kill_9_mid_step_then_resume_loses_nothing(tmp_path):
    run = tmp_path / "killed"
    args = [
        "train",
        *TINY,
        "--groups-per-step",
        "4",
        "--rollout.max-new-tokens",
        "48",
        "--steps",
        "3",
        "--eval.tasks",
        "0",  # its evaluations (before step 0, after the last) are not what this test checks
        "--out",
        str(run),
    ]
    with (tmp_path / "killed.log").open("wb") as sink:  # a file: an undrained pipe could block the trainer
        proc = subprocess.Popen([*AGENTRL, *args], stdout=sink, stderr=subprocess.STDOUT)
    traj_file = run / "trajectories.jsonl"
    # Kill once step 1 has finished at least one episode but before its update.
    assert _wait_for(lambda: any('"step":1' in line for line in _lines(traj_file))), "step 1 never started"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _lines(traj_file)
    assert any('"step":1' in line for line in before)
    assert steps_of(run) == [0]

    # The resume in this process: the killed process is the one that had to be a fresh interpreter; what the
    # resume finds can only come from the run folder it left.
    assert cli_main(["train", "--resume", str(run), "--no-progress"]) == 0
    after = _lines(traj_file)
    assert after[: len(before)] == before  # nothing completed before the kill was lost or rewritten
    assert steps_of(run) == [0, 1, 2]  # no step twice
    step1 = [t for t in read_trajectories(run) if t.meta.step == 1]
    counts: dict[str, int] = {}
    for line in before:
        rec = json.loads(line)
        if rec["meta"]["step"] == 1:
            counts[rec["group_id"]] = counts.get(rec["group_id"], 0) + 1
    complete_before = [g for g, n in counts.items() if n == 2]
    # Complete groups from before the kill were reused, not sampled again.
    assert read_metrics(run)[1]["episodes/reused"] == 2 * len(complete_before)
    assert len({t.meta.task_id for t in step1}) == 4


@pytest.mark.slow
def test_sigterm_checkpoints_and_exits(tmp_path):
    run = tmp_path / "termed"
    proc = subprocess.Popen(
        [*AGENTRL, "train", *TINY, "--eval.tasks", "0", "--steps", "5", "--out", str(run)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    traj_file = run / "trajectories.jsonl"
    assert _wait_for(lambda: any('"step":1' in line for line in _lines(traj_file)))
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert "resume with" in stdout
    ckpts = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert ckpts[-1] in ("step-000001", "step-000002")


def test_cli_rejects_bad_settings(capsys, tmp_path):
    assert cli_main(["train", "--model", "tiny", "--group-size", "0", "--out", str(tmp_path / "x")]) == 2
    assert "--group-size must be a positive integer" in capsys.readouterr().err
    assert (
        cli_main(["train", "--model", "tiny", "--rollout.temperature", "0.7", "--out", str(tmp_path / "y")])
        == 2
    )
    assert "differ" in capsys.readouterr().err
    assert cli_main(["train", "--model", str(tmp_path), "--out", str(tmp_path / "z")]) == 2
    assert "not a Hugging Face model folder" in capsys.readouterr().err
    assert cli_main(["train", "--resume", str(tmp_path / "nope")]) == 2
    assert "no config.json" in capsys.readouterr().err
    assert cli_main(["train", "--estimator", "ppo"]) == 2
    assert "expected one of ['otb', 'grpo', 'rloo', 'opo', 'none']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli_main(["train", "--no-such-flag"])


def test_rollout_settings_have_one_owner_and_old_config_files_load():
    """TrainConfig embeds the rollout's own RolloutConfig (no copy of its fields); a config.json written
    before that (its rollout section had five keys) loads into it unchanged."""
    from agentrl.rollout import RolloutConfig

    cfg = TrainConfig()
    assert type(cfg.rollout) is RolloutConfig and cfg.rollout.on_template_mismatch == "stop"
    assert (cfg.rollout.max_turns, cfg.rollout.max_new_tokens, cfg.rollout.concurrency) == (3, 96, 16)
    old = dict(max_turns=2, max_new_tokens=24, max_total_tokens=512, temperature=1.0, concurrency=4)
    loaded = config_from_dict(TrainConfig, {"model": "tiny", "rollout": old})
    assert {k: getattr(loaded.rollout, k) for k in old} == old
    with pytest.raises(ConfigError, match="top-p"):
        TrainConfig(rollout=RolloutConfig(top_p=0.9))


def test_help_documents_every_setting(capsys):
    with pytest.raises(SystemExit):
        cli_main(["train", "--help"])
    text = capsys.readouterr().out
    for flag in (
        "--model",
        "--env",
        "--estimator",
        "--group-size",
        "--steps",
        "--out",
        "--resume",
        "--seed",
        "--device",
        "--learner.lr",
        "--rollout.max-new-tokens",
        "--rollout.max-turns",
        "--rollout.max-total-tokens",
        "--rollout.temperature",
        "--rollout.concurrency",
        "--estimator.zero-tail",
        "--estimator.norm-by-std",
        "--estimator.eps",
    ):
        assert flag in text
    assert "{otb,grpo,rloo,opo,none}" in text
    # A nested setting shows the trainer's default, not its class's (RolloutConfig's own is 8 turns).
    assert "episode as truncated (stop reason max_turns). (default: 3)" in " ".join(text.split())


def test_plot_and_envs_commands(two_step_run, capsys):
    run, _ = two_step_run
    assert cli_main(["plot", str(run)]) == 0
    assert (Path(run) / "plots" / "reward.png").exists()
    # A synchronous run has no staleness: no flat plot of zeros, and a line that says so (issue 47).
    assert not (Path(run) / "plots" / "staleness.png").exists()
    assert "not plotted, every value 0 in this run: " in capsys.readouterr().out
    assert cli_main(["envs"]) == 0
    assert "math-tir-v0" in capsys.readouterr().out


def test_eval_reports_pass_at_k_on_the_held_out_split(two_step_run, capsys):
    run, _ = two_step_run
    model = run / "checkpoints" / "step-000002" / "model"
    # In this process: the fixture's run already checks `python -m agentrl.trainers`; a fresh interpreter's
    # imports were most of this test's time. The run's token limit (24), not eval's default 96, per turn.
    args = ["eval", "--model", str(model), "--env", "math-tir-v0", "--k", "2", "--tasks", "2", "--json"]
    assert cli_main([*args, "--max-new-tokens", "24"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["split"] == "test" and report["tasks"] == 2 and report["samples_per_task"] == 2
    assert 0.0 <= report["pass_at_1"] <= report["pass_at_k"] <= 1.0


def test_pass_at_k_estimator():
    from agentrl.trainers.evaluate import pass_at_k

    assert pass_at_k(4, 0, 4) == 0.0 and pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10)
    with pytest.raises(ConfigError, match="pass@k needs"):
        pass_at_k(2, 3, 1)


@pytest.mark.slow
@pytest.mark.timeout(600)  # a real SmolLM2-135M step in a subprocess: run_cli's own limit
def test_embedded_default_smoke_one_step(tmp_path):
    """The README's main job on the real SmolLM2-135M, shrunk to one small step."""
    run = tmp_path / "default"
    out = run_cli(
        [
            "train",
            "--steps",
            "1",
            "--groups-per-step",
            "1",
            "--group-size",
            "2",
            "--rollout.max-new-tokens",
            "48",
            "--eval.tasks",
            "1",
            "--eval.samples",
            "1",  # the held-out evaluation runs (untrained and trained): one episode each is enough for that
            "--no-progress",
            "--out",
            str(run),
        ]
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "smollm2 on math-tir-arith-v0, otb" in out.stdout
    trained = json.loads((run / "eval.json").read_text())["trained"]
    assert trained["tasks"] == 1 and trained["samples_per_task"] == 1
    (row,) = read_metrics(run)
    assert math.isfinite(row["learn/grad_norm"]) and math.isfinite(row["learn/loss"])
    trajs = list(read_trajectories(run))
    assert len(trajs) == 2 and not any(t.infra_failure for t in trajs)
    assert (run / "checkpoints" / "step-000001" / "model" / "config.json").exists()


def test_policy_choice_on_cpu(capsys, tmp_path):
    import torch

    from agentrl.chat import ChatRenderer
    from agentrl.models import smollm2_tokenizer, tiny_model
    from agentrl.policies import HFPolicy
    from agentrl.trainers.train_setup import make_policy

    tok = smollm2_tokenizer()
    model, renderer = tiny_model(tok), ChatRenderer(tok)
    cpu = torch.device("cpu")
    policy = make_policy(TrainConfig(model="tiny"), model, tok, renderer, cpu, version=3)
    assert isinstance(policy, HFPolicy) and policy.model is model and policy.version == 3  # shared weights
    with pytest.raises(ConfigError, match="--policy vllm needs --device cuda"):
        make_policy(TrainConfig(model="tiny", policy="vllm"), model, tok, renderer, cpu, version=0)
    with pytest.raises(ConfigError, match="--policy vllm-server needs --vllm-url"):
        make_policy(TrainConfig(model="tiny", policy="vllm-server"), model, tok, renderer, cpu, version=0)
    from agentrl.policies import VLLMServerPolicy

    cfg = TrainConfig(model="tiny", policy="vllm-server", vllm_url="http://127.0.0.1:8000/v1", vllm_model="m")
    server = make_policy(cfg, model, tok, renderer, cpu, version=3)
    assert (
        isinstance(server, VLLMServerPolicy) and server.version == 3 and server.url == "http://127.0.0.1:8000"
    )
    assert server.stop_token_ids == tuple(renderer.stop_token_ids)
