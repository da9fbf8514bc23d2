"""Supervised warm start for chain-sum: a few hundred steps of teacher forcing on expert episodes.

It is stopped early on purpose, so that the policy knows the format but still fails most episodes
(held-out success low but non-zero): RL then has something to learn, and only a sparse outcome reward to
learn it from. The checkpoint is cached (``torch.save`` of the state dict) and shared by every RL run.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from fast_rollout import Vocab, sample_episodes
from tiny_task import build_tokenizer, prompt_text, sample_numbers, tiny_policy


def _noisy(text: str, rng: np.random.Generator | None, p: float) -> str:
    """Each digit replaced by a different random digit with probability ``p``."""
    if rng is None or p <= 0:
        return text
    out = []
    for c in text:
        if c.isdigit() and rng.random() < p:
            c = str((int(c) + int(rng.integers(1, 10))) % 10)
        out.append(c)
    return "".join(out)


def expert_stream(
    vocab: Vocab, numbers: Sequence[int], rng: np.random.Generator | None = None, p: float = 0.0
) -> tuple[list[int], list[int]]:
    """Token ids and loss mask (1 on model tokens) of a demonstration, as the rollout would lay it out.

    With ``p > 0`` the demonstrator slips: every digit it writes (restated numbers, call operands, the
    answer) is wrong with probability ``p``; the tool answers the call actually written and the episode
    carries on from there, so a slip in an operand or the answer makes it fail, one in the scratchpad does
    not. Imitating it gives a policy whose errors are spread over the whole episode.
    """
    ids = [vocab.user, *vocab.encode(prompt_text(numbers)), vocab.eot, vocab.asst]
    mask = [0] * len(ids)
    acc = numbers[0]
    for j in range(1, len(numbers) + 1):
        if j < len(numbers):
            rest = _noisy(" ".join(map(str, numbers[j:])), rng, p)
            a, b = _noisy(str(acc), rng, p), _noisy(str(numbers[j]), rng, p)
            turn = f"[{rest}]A{a}+{b}"
        else:
            turn = "R" + _noisy(str(acc), rng, p)
        t = [*vocab.encode(turn), vocab.eot]
        ids += t
        mask += [1] * len(t)
        if j < len(numbers):
            acc = int(a) + int(b)
            obs = [vocab.tool, *vocab.encode(str(acc)), vocab.eot, vocab.asst]
            ids += obs
            mask += [0] * len(obs)
    return ids, mask


def sft_batch(
    vocab: Vocab, rng: np.random.Generator, n: int, ks: Sequence[int], p: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` demonstrations with K drawn from ``ks``, right-padded: (input_ids [n, T], loss mask [n, T])."""
    rows = [expert_stream(vocab, sample_numbers(rng, int(rng.choice(ks)), "train"), rng, p) for _ in range(n)]
    T = max(len(r[0]) for r in rows)
    ids = torch.full((n, T), vocab.pad, dtype=torch.long)
    mask = torch.zeros((n, T))
    for i, (a, m) in enumerate(rows):
        ids[i, : len(a)] = torch.tensor(a)
        mask[i, : len(m)] = torch.tensor(m, dtype=torch.float32)
    return ids, mask


def held_out(k: int, n: int, seed: int = 12345) -> list[list[int]]:
    """A fixed list of ``n`` held-out prompts with K numbers."""
    rng = np.random.default_rng(seed + k)
    return [sample_numbers(rng, k, "test") for _ in range(n)]


def success(model: torch.nn.Module, vocab: Vocab, prompts: Sequence[Sequence[int]], seed: int = 0) -> float:
    """Mean reward of one sampled episode (temperature 1) per prompt."""
    g = torch.Generator().manual_seed(seed)
    _, r = sample_episodes(model, vocab, prompts, generator=g, build=False)
    return float(r.mean())


def warm_start(
    steps: int,
    *,
    ks: Sequence[int] = (4,),
    slip: float = 0.0,
    batch: int = 64,
    lr: float = 3e-3,
    seed: int = 0,
    hidden: int = 64,
    layers: int = 2,
    log_every: int = 0,
    until: float | None = None,
    until_k: int = 4,
) -> torch.nn.Module:
    """Train a fresh tiny policy for at most ``steps`` SFT steps and return it.

    ``until``: stop as soon as held-out success at K = ``until_k`` (128 prompts, checked every 25 steps)
    reaches this value — the early stop that leaves RL something to learn.
    """
    tok = build_tokenizer()
    vocab = Vocab.of(tok)
    model = tiny_policy(len(tok), seed=seed, hidden=hidden, layers=layers)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    rng = np.random.default_rng(seed)
    model.train()
    t0 = time.perf_counter()
    for s in range(steps):
        ids, mask = sft_batch(vocab, rng, batch, ks, slip)
        logits = model(input_ids=ids).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
        )
        m = mask[:, 1:].reshape(-1)
        loss = (nll * m).sum() / m.sum()
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if log_every and (s + 1) % log_every == 0:
            sr = {k: success(model, vocab, held_out(k, 128)) for k in ks}
            print(f"sft step {s + 1}: loss {loss.item():.3f} success {sr} ({time.perf_counter() - t0:.0f}s)")
        if until is not None and (s + 1) % 25 == 0 and success(model, vocab, held_out(until_k, 128)) >= until:
            break
    return model


def load_or_train(path: Path, steps: int, **kw: object) -> torch.nn.Module:
    """The cached warm start at ``path``, trained (and saved) first if missing."""
    tok = build_tokenizer()
    hidden = int(kw.get("hidden", 64))  # type: ignore[call-overload]
    layers = int(kw.get("layers", 2))  # type: ignore[call-overload]
    if path.exists():
        model = tiny_policy(len(tok), hidden=hidden, layers=layers)
        model.load_state_dict(torch.load(path, weights_only=True))
        return model
    model = warm_start(steps, **kw)  # type: ignore[arg-type]
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)
    return model
