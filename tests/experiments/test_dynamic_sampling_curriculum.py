"""The chain-sum dynamic-sampling experiment with the curriculum: its draws are the trainer's TaskSampler's.

The experiment's fast sampler cannot run the trainer's loop, so it drives
:class:`agentrl.trainers.task_sampler.TaskSampler` itself (task seed → prompt, seed recorded on the groups,
every group observed when its step trains). These tests check that adapter against an independent
TaskSampler rebuilt, step by step, from the observations the run recorded, and that runs without the
curriculum keep their names and their prompt stream.
"""

import argparse
import json

import dynamic_sampling as dsx
import numpy as np
import pytest
import torch
from fast_rollout import Vocab, group_rollout
from tiny_task import build_tokenizer, prompt_text, sample_numbers, tiny_policy

from agentrl.trainers.task_sampler import TaskSampler


@pytest.fixture(scope="module")
def tiny_tok():
    return build_tokenizer()


def _args(budget):
    return argparse.Namespace(budget=budget, eval_every=10**9, eval_prompts=4, max_draws=4)


def test_task_numbers_is_a_pure_function_of_the_task_seed():
    a = dsx.task_numbers(1_000_003, 4)
    assert a == dsx.task_numbers(1_000_003, 4) == sample_numbers(np.random.default_rng(1_000_003), 4, "train")
    assert a != dsx.task_numbers(1_000_004, 4)


def test_group_rollout_records_the_task_seeds_on_every_member(tiny_tok):
    vocab = Vocab.of(tiny_tok)
    model = tiny_policy(len(tiny_tok))
    prompts = [dsx.task_numbers(s, 4) for s in (7, 8)]
    trajs = group_rollout(
        model, vocab, prompts, 3, generator=torch.Generator().manual_seed(0), task_seeds=[7, 8]
    )
    assert [t.meta.seed for t in trajs] == [7, 7, 7, 8, 8, 8]
    assert [t.meta.task_id for t in trajs][::3] == [prompt_text(p) for p in prompts]
    with pytest.raises(ValueError, match="task seeds"):
        group_rollout(model, vocab, prompts, 3, generator=torch.Generator(), task_seeds=[7])


@pytest.mark.parametrize("ds", [False, True])
def test_curriculum_run_draws_what_the_trainers_sampler_draws_from_its_observations(tiny_tok, ds):
    # A random tiny policy fails every episode: every group is all-fail, so its task goes to the "unsolved"
    # pool and later steps draw some of them again (the run is not vacuous: revisits are checked below).
    warm = tiny_policy(len(tiny_tok)).state_dict()
    rec = dsx.run_one("grpo", 4, 3, ds, _args(budget=4000 if ds else 1500), warm, "difficulty")
    steps = rec["steps"]
    assert rec["curriculum"] == "difficulty" and len(steps) >= 3
    B = 8
    history: dict[str, list[list[float]]] = {}
    for k, s in enumerate(steps):
        # An independent sampler that only knows the observations of the steps before k (lag 0).
        ref = TaskSampler(3, B, 4 * B if ds else B, "difficulty")
        ref.load_state({"version": 1, "curriculum": "difficulty", "history": history})
        assert s["tasks"] == ref.tasks(k, range(s["drawn"])), k
        assert len(set(s["tasks"])) == s["drawn"]  # a task at most once per step
        assert [o[0] for o in s["observed"]] == s["tasks"]  # every drawn group observed, filtered ones too
        for task, mean in s["observed"]:
            history.setdefault(str(task), []).append([k, mean])
    assert sum(s["revisits"] for s in steps) > 0, "no task was drawn again: the check would be vacuous"
    if ds:
        assert all(s["drawn"] == 4 * B and s["trained"] == 0 for s in steps)  # all filtered: capped


def test_runs_without_the_curriculum_keep_their_names_and_record_no_tasks(tiny_tok):
    warm = tiny_policy(len(tiny_tok)).state_dict()
    rec = dsx.run_one("otb", 4, 0, False, _args(budget=600), warm)
    assert rec["curriculum"] == "none" and "tasks" not in rec["steps"][0]
    assert dsx.run_name("otb", 4, 0, False, "none") == "otb-N4-s0-dsoff"
    assert dsx.run_name("otb", 4, 0, True, "difficulty") == "otb-N4-s0-dson-curdifficulty"
    with pytest.raises(ValueError, match="curriculum"):
        dsx.run_one("otb", 4, 0, False, _args(budget=600), warm, "easy")


def test_report_table_gives_per_seed_values_and_marks_censored_runs(tmp_path):
    def rec(seed, finals):
        curve = [{"tokens": 20_000 * i, "step": i, "success": s} for i, s in enumerate(finals)]
        steps = [{"tokens": 1, "drawn": 10, "zero_variance": 2, "trained": 8, "revisits": 1}]
        return {
            "estimator": "otb",
            "group_size": 4,
            "seed": seed,
            "dynamic_sampling": True,
            "curriculum": "difficulty",
            "budget": 40_000,
            "curve": curve,
            "steps": steps,
            "wall_s": 1.0,
        }

    # Seed 0 reaches 0.5 at 10k tokens (interpolated) and 0.6 at 20k, never 0.7; seed 1 never reaches 0.5.
    (tmp_path / "a.json").write_text(json.dumps(rec(0, [0.4, 0.6, 0.65])))
    (tmp_path / "b.json").write_text(json.dumps(rec(1, [0.1, 0.2, 0.3])))
    rep = dsx.report(tmp_path)
    row = rep["otb-N4-dson-curdifficulty"]
    assert row["tokens_to_0.5"]["per_seed"] == [10_000, 40_000]
    assert row["tokens_to_0.5"]["censored_per_seed"] == [False, True]
    assert row["zero_variance_frac_of_drawn"] == 0.2 and row["revisit_frac_of_drawn"] == 0.1
    table = dsx.markdown(rep).splitlines()
    assert len(table) == 3
    assert table[2].startswith(
        "| otb | on | difficulty | 0,1 | 20 % | 10 % | 25k [10k, 40k] (10k, >40k, 1 censored) |"
    )
    assert table[2].endswith("| 0.47 [0.30, 0.65] (0.65, 0.30) |")
