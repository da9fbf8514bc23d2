"""`agentrl train --lora.rank R` end to end on CPU: adapter-only checkpoints with their optimizer state and
base record, exact resume, a refused resume onto another base, the served adapter checked after every sync
(and a sampler that never gets the adapter caught: verl #7495), replay of a step, `agentrl eval` on the run,
and `agentrl export --merged` writing a folder transformers loads."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import functools
import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file

from agentrl.errors import PolicyError, StoreError
from agentrl.learner import LearnerConfig
from agentrl.lora import BASE_FILE, LoraConfig, adapter_state, apply_lora
from agentrl.lora_sync import read_syncs
from agentrl.metrics import read_metrics
from agentrl.models import ModelSpec, resolve_model, tiny_model
from agentrl.rollout import RolloutConfig
from agentrl.run import RunDir
from agentrl.testing import RecordingWeightSink, ScriptedPolicy
from agentrl.trainers.cli import main as cli_main
from agentrl.trainers.evaluate import EvalConfig
from agentrl.trainers.export import export_merged
from agentrl.trainers.local import local_runtime
from agentrl.trainers.train import TrainConfig, train

LORA = LoraConfig(rank=4, alpha=8.0)


def _cfg(tmp_path, name, **kw):
    """guess-number with a scripted sampler whose guesses depend on the seed (reward variance, so every step
    has a gradient), as tests/trainers/test_precision.py does."""
    base = TrainConfig(
        model="tiny",
        env="guess-number-v0",
        env_kwargs={"low": 1, "high": 3, "max_guesses": 1},
        group_size=4,
        groups_per_step=2,
        steps=2,
        out=str(tmp_path / name),
        progress=False,
        rollout=RolloutConfig(max_turns=1, max_new_tokens=8, max_total_tokens=512, seed=5, concurrency=8),
        learner=LearnerConfig(lr=1e-3),
        keep_checkpoints=5,
        lora=LORA,
        eval=EvalConfig(tasks=0),  # no test here reads the run's own held-out evaluation
    )
    return dataclasses.replace(base, **kw)


class AdapterSampler(RecordingWeightSink):
    """Scripted tokens, but an own copy of the adapted model that takes every published adapter (as an
    HFPolicy with its own weights does); ``drop=True`` takes the version and drops the tensors: the verl
    #7495 sampler that keeps serving the initial adapter."""

    def __init__(self, policy, model, *, drop=False):
        super().__init__(policy)
        self.model, self.drop = model, drop

    async def load_weights(self, update):
        await super().load_weights(update)
        if not self.drop:
            own = self.model.state_dict()
            with torch.no_grad():
                for k, v in update.named_tensors.items():
                    own[k].copy_(v)


def _sampler(tok, cfg, *, drop=False):
    stop = tok.convert_tokens_to_ids("<|im_end|>")

    def turn(prompt_ids, sampling):
        guess = 1 + int(hashlib.sha256(str(sampling.seed).encode()).hexdigest(), 16) % 3
        return [*tok.encode(str(guess), add_special_tokens=False), stop]

    # Built apart from the learner's, from the same spec and seed: the seeded initial adapter must agree.
    model = apply_lora(tiny_model(tok, seed=cfg.seed), cfg.lora, name=cfg.model, seed=cfg.seed).model
    return AdapterSampler(ScriptedPolicy(turn, with_sampling=True, stop_ids=[stop]), model, drop=drop)


def _run(cfg, tok, *, drop=False):
    runtime = functools.partial(local_runtime, sampler=_sampler(tok, cfg, drop=drop))
    return asyncio.run(train(cfg, runtime=runtime))


def _adapter(run, step):
    return load_file(str(RunDir(run).checkpoint(step).model_dir / "adapter_model.safetensors"))


@pytest.fixture(scope="module")
def straight(tmp_path_factory, tok):
    tmp = tmp_path_factory.mktemp("lora")
    return _run(_cfg(tmp, "straight"), tok)


def test_lora_checkpoints_hold_the_adapter_its_optimizer_state_and_the_base(straight):
    ckpt = RunDir(straight).checkpoint(2)
    files = {p.name for p in ckpt.model_dir.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", BASE_FILE} <= files
    assert not any(f.startswith("model") and f.endswith(".safetensors") for f in files)  # no base weights
    base = json.loads((ckpt.model_dir / BASE_FILE).read_text())
    assert base["name"] == "tiny" and len(base["sha256"]) == 64
    adapter = _adapter(straight, 2)
    assert adapter and all(".lora_A." in k or ".lora_B." in k for k in adapter)
    optim = torch.load(ckpt.path / "optimizer.pt", weights_only=False)
    assert len(optim["state"]) == len(adapter)  # Adam moments for the adapter's tensors, nothing else
    n_adapter = sum(t.numel() for t in adapter.values())
    assert all(s["exp_avg"].numel() <= n_adapter for s in optim["state"].values())
    rows = read_metrics(straight)
    assert [r["step"] for r in rows] == [0, 1] and all(r["learn/update_rel_norm"] > 0 for r in rows)
    a1, a2 = _adapter(straight, 1), _adapter(straight, 2)
    assert any(not torch.equal(a1[k], a2[k]) for k in a1)


def test_every_sync_serves_the_learners_new_adapter(straight):
    syncs = read_syncs(RunDir(straight))
    assert [s.version for s in syncs] == [0, 1, 2]
    assert all(s.sha256 == s.learner_sha256 for s in syncs)
    assert len({s.sha256 for s in syncs}) == 3  # the served adapter changed after each step
    assert 0 < syncs[0].adapter_bytes < 200_000  # the adapter, not the 3.2 M-parameter model


def test_a_sampler_that_never_receives_the_adapter_fails_the_run(tmp_path, tok):
    with pytest.raises(PolicyError, match="adapter sync to version 1 failed"):
        _run(_cfg(tmp_path, "dropped"), tok, drop=True)


def test_lora_resume_is_exact_and_refuses_another_base(tmp_path, tok, straight):
    half = _cfg(tmp_path, "resumed", steps=1)
    _run(half, tok)
    resumed = _run(dataclasses.replace(half, steps=2, resume=half.out), tok)
    a, b = _adapter(straight, 2), _adapter(resumed, 2)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    ra, rb = read_metrics(straight), read_metrics(resumed)
    assert ra[1]["learn/loss"] == rb[1]["learn/loss"]

    other = _cfg(tmp_path, "other", steps=1)
    _run(other, tok)
    base_file = RunDir(other.out).checkpoint(1).model_dir / BASE_FILE
    rec = json.loads(base_file.read_text())
    base_file.write_text(json.dumps({**rec, "sha256": "0" * 64}))  # as if trained on other base weights
    with pytest.raises(StoreError, match="trained on base"):
        _run(dataclasses.replace(other, steps=2, resume=other.out), tok)


def test_eval_replay_and_export_read_a_lora_run(tmp_path, straight, tok, capsys):
    loaded = resolve_model(ModelSpec(str(straight), device="cpu"), tokenizer=False)
    held = adapter_state(loaded.model)
    saved = _adapter(straight, 2)
    assert held is not None and len(held) == len(saved)
    ids = torch.tensor([tok.encode("What is 2+3?")])
    with torch.no_grad():
        want = loaded.model(ids).logits

    out = export_merged(straight, tmp_path / "merged")
    from transformers import AutoModelForCausalLM

    merged = AutoModelForCausalLM.from_pretrained(str(out), local_files_only=True)
    assert not any("lora" in k for k in merged.state_dict())
    with torch.no_grad():
        got = merged(ids).logits
    assert torch.allclose(got, want, atol=1e-4), (got - want).abs().max()
    base = copy.deepcopy(tiny_model(tok, seed=0))
    with torch.no_grad():
        assert (base(ids).logits - want).abs().max() > 1e-4  # the merged weights carry the trained adapter

    for k in (0, 1):  # step 0 from the rebuilt base and seeded adapter, step 1 from its adapter checkpoint
        capsys.readouterr()
        assert cli_main(["replay", str(straight), "--step", str(k), "--json"]) == 0
        step = json.loads(capsys.readouterr().out)["step"]
        assert step["matches"] and any(c["name"] == "learn/grad_norm" for c in step["checks"])
        assert ("adapter" in step["weights"]) and (k == 0 or "LoRA adapter on tiny" in step["weights"])
    # `agentrl export` says which checkpoint it merged, into which base (issue 47).
    capsys.readouterr()
    assert cli_main(["export", str(straight), "--merged", str(tmp_path / "m1"), "--step", "1"]) == 0
    said = capsys.readouterr().out
    assert "merged the LoRA adapter (rank" in said and "step-000001 (after 1 steps) into its base" in said
    args = ["eval", "--model", str(straight), "--env", "calculator-v0", "--tasks", "1", "--k", "1"]
    assert cli_main([*args, "--max-new-tokens", "4", "--max-turns", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["episodes"] == 1


def test_the_cli_trains_lora_asynchronously_with_a_real_hf_sampler_of_its_own(tmp_path):
    """`--lora.rank` from the command line, with --max-staleness 1: the HF sampler holds its own adapted copy
    (the learner trains in a thread meanwhile) and takes each new adapter; an entropy bonus gives the tiny
    model's zero-reward episodes a gradient, so the adapter moves every step."""
    out = tmp_path / "cli"
    args = [
        "train",
        "--model",
        "tiny",
        "--env",
        "calculator-v0",
        "--group-size",
        "2",
        "--groups-per-step",
        "2",
    ]
    args += [
        "--rollout.max-new-tokens",
        "6",
        "--rollout.max-turns",
        "1",
        "--eval.tasks",
        "0",
        "--no-progress",
    ]
    args += ["--steps", "2", "--max-staleness", "1", "--learner.lr", "1e-2", "--learner.entropy-coef", "0.1"]
    args += ["--lora.rank", "4", "--lora.alpha", "8", "--lora.targets", "q_proj,v_proj", "--out", str(out)]
    assert cli_main(args) == 0
    syncs = read_syncs(RunDir(out))
    assert [s.version for s in syncs] == [0, 1, 2]
    assert all(s.sha256 == s.learner_sha256 for s in syncs) and len({s.sha256 for s in syncs}) == 3
    adapter = _adapter(out, 2)
    assert {k.split(".")[-3] for k in adapter} == {"q_proj", "v_proj"}
    assert json.loads((out / "config.json").read_text())["weights"]["lora"]["rank"] == 4


def test_lora_with_a_vllm_server_sampler_serves_one_adapter_per_live_version(tok):
    from agentrl.chat import ChatRenderer
    from agentrl.policies import VLLMServerPolicy
    from agentrl.trainers.train_setup import make_policy

    cfg = TrainConfig(
        model="tiny", lora=LORA, policy="vllm-server", vllm_url="http://127.0.0.1:1", max_staleness=2
    )
    model = tiny_model(tok, seed=0)
    policy = make_policy(cfg, model, tok, ChatRenderer(tok), torch.device("cpu"), version=0)
    assert isinstance(policy, VLLMServerPolicy)
    assert policy.lora == LORA and policy.max_live_adapters == 3  # --max-staleness + 1
