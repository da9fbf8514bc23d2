"""Recorded trajectory pools for the variance study: the tiny policy (fast rollout, chain-sum) and
SmolLM2-135M (``record_smollm2.py``'s JSONL on math-tir-arith-v0). One ``.npz`` per prompt; existing files are
kept, so interrupted jobs resume."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import gradvar as gv
import numpy as np
import torch
from fast_rollout import Vocab, group_rollout
from tiny_task import build_tokenizer, sample_numbers, tiny_policy
from variance import load_pool, save_pool


def tiny_pools(
    work: Path, warm: dict[str, torch.Tensor], k: int, prompts: int, samples: int, modes: tuple[str, ...]
) -> dict[str, list[Path]]:
    """``prompts`` chain-sum prompts × ``samples`` episodes of the warm-started policy; one pool per prompt
    and Gram mode (``full``: every parameter; ``tail``: the position-wise tail, as for SmolLM2)."""
    tok = build_tokenizer()
    vocab = Vocab.of(tok)
    hidden = int(warm["model.embed_tokens.weight"].shape[1])
    layers = sum(1 for n in warm if n.endswith("input_layernorm.weight"))
    model = tiny_policy(len(tok), hidden=hidden, layers=layers)
    model.load_state_dict(warm)
    rng = np.random.default_rng(777 + k)
    gen = torch.Generator().manual_seed(777 + k)
    out: dict[str, list[Path]] = {m: [] for m in modes}
    for p in range(prompts):
        nums = sample_numbers(rng, k, "train")
        trajs = group_rollout(model, vocab, [nums], samples, generator=gen)
        for mode in modes:
            path = work / "pools" / f"tiny-k{k}-{mode}" / f"prompt{p:02d}.npz"
            if not path.exists():
                save_pool(gv.make_pool(" ".join(map(str, nums)), model, trajs, mode), path)
            out[mode].append(path)
    return out


def full_norm_sample(model: torch.nn.Module, traj: object, which: np.ndarray) -> np.ndarray:
    """‖∇_θ log π(y_k)‖² over every parameter for the model tokens ``which`` of one trajectory."""
    params = [p for p in model.parameters() if p.requires_grad]
    pos = torch.from_numpy(gv.model_positions(traj))  # type: ignore[arg-type]
    ids = torch.tensor(traj.token_ids)[None]  # type: ignore[attr-defined]
    logits = model(input_ids=ids).logits[0]
    lp = torch.log_softmax(logits[pos[which] - 1].float(), dim=-1).gather(1, ids[0, pos[which]][:, None])[
        :, 0
    ]
    out = []
    for j in range(len(which)):
        g = torch.autograd.grad(lp[j], params, retain_graph=j + 1 < len(which))
        out.append(float(sum(float(x.double().square().sum()) for x in g)))
    return np.array(out)


def smollm2_pools(work: Path, jsonl: Path, seeds: list[int], full_sample: int = 8) -> list[Path]:
    """Tail-Gram pools of the recorded SmolLM2 trajectories of the prompts ``seeds`` (under the heavy lock),
    plus full-parameter squared norms of ``full_sample`` random model tokens from one tool-using and one
    tool-free trajectory per prompt (when the prompt has one of each)."""
    from agentrl import read_trajectories
    from agentrl.models import load_model, smollm2_dir

    groups = defaultdict(list)
    for t in read_trajectories(jsonl):
        groups[t.meta.task_id].append(t)
    paths = []
    model = None
    for s in seeds:
        key = f"math-tir-arith-v0:{s}"
        if key not in groups:
            print(f"prompt {s}: not recorded yet, skipped")
            continue
        path = work / "pools" / "smollm2-tail" / f"prompt{s:02d}.npz"
        paths.append(path)
        if path.exists():
            continue
        if model is None:
            model = load_model(smollm2_dir())
        trajs = [t for t in groups[key] if not t.infra_failure and t.num_model_tokens > 0]
        pool = gv.make_pool(key, model, trajs, "tail")
        rng = np.random.default_rng(s)
        traj_idx, tok_idx, norms = [], [], []
        for uses in (True, False):
            cands = [i for i, t in enumerate(trajs) if (len(t.tool_calls) > 0) == uses]
            if not cands:
                continue
            i = int(rng.choice(cands))
            which = np.sort(
                rng.choice(
                    trajs[i].num_model_tokens, size=min(full_sample, trajs[i].num_model_tokens), replace=False
                )
            )
            norms.append(full_norm_sample(model, trajs[i], which))
            traj_idx += [i] * len(which)
            tok_idx += list(pool.offsets[i] + which)
        save_pool(
            pool,
            path,
            full_tok=np.array(tok_idx, dtype=np.int64),
            full_traj=np.array(traj_idx, dtype=np.int64),
            full_sq=np.concatenate(norms) if norms else np.zeros(0),
        )
        print(f"prompt {s}: {len(trajs)} trajectories, {len(pool.logprobs)} model tokens", flush=True)
    return paths


def load_all(paths: list[Path]) -> list[gv.PromptPool]:
    """Load pools."""
    return [load_pool(p)[0] for p in paths]
