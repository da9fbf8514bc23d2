"""The tiny policy for long-chain-v0: a character-level tokenizer, a 0.1 M-parameter Llama, a warm start.

Same recipe as ``experiments/otb_reproduction`` (one token per character, five control tokens, a short
supervised warm start stopped early so that RL has something left to learn), for the long-chain alphabet
(digits, space, ``+[]ACRS``). The demonstrations are made by agentrl's own rollout: a demonstrator that
reads the context it is shown and writes the next right turn (with digit slips) plays
:class:`~agentrl.envs.long_chain.LongChainEnv` through :func:`agentrl.samples.run_samples`, so the warm
start is trained on exactly the token sequences (samples, compactions, summary turns) that RL will see.
The warm-started model is saved as an ordinary Hugging Face folder, so ``agentrl train --model DIR`` loads
it.
"""

from __future__ import annotations

import asyncio
import random
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "otb_reproduction"))
import tiny_task

from agentrl.chat import ChatRenderer
from agentrl.envs.long_chain import LongChainEnv
from agentrl.rollout import RolloutConfig
from agentrl.samples import run_samples
from agentrl.testing import ScriptedPolicy
from agentrl.types import Trajectory

CHARS = tuple("0123456789 +[]ACRS")
"""The long-chain alphabet; the tokenizer, chat template and model are the OTB reproduction's."""
_MESSAGE = re.compile(r"<([uat])>(.*?)<e>")


def build_tokenizer() -> Any:
    """The reproduction's character-level tokenizer over the long-chain alphabet (23 tokens, no files)."""
    return tiny_task.build_tokenizer(CHARS)


def tiny_policy(vocab_size: int, *, seed: int = 0, hidden: int = 64, layers: int = 2) -> Any:
    """The reproduction's random-init tiny Llama (about 0.1 M parameters), room for 1,024 positions."""
    return tiny_task.tiny_policy(vocab_size, seed=seed, hidden=hidden, layers=layers, max_positions=1024)


def _slip(text: str, rng: random.Random, p: float) -> str:
    """Each digit replaced by a different random digit with probability ``p``."""
    return "".join(
        str((int(c) + rng.randint(1, 9)) % 10) if c.isdigit() and rng.random() < p else c for c in text
    )


def next_turn(context: str, rng: random.Random, p: float) -> str:
    """The right next turn for the context shown (decoded with its control tokens), with digit slips.

    The state is read from the context alone, as a policy must: the last task message (the numbers, or a
    compacted ``sum rest...``), then one number consumed per tool result, the sum being the tool's output.
    """
    msgs = _MESSAGE.findall(context)
    start = max(i for i, (role, text) in enumerate(msgs) if role == "u" and text != "C")
    nums = [int(x) for x in msgs[start][1].split()]
    acc, rest = nums[0], nums[1:]
    for role, text in msgs[start + 1 :]:
        if role == "t":
            acc, rest = (int(text) if text.isdigit() else acc), rest[1:]
    if msgs[-1] == ("u", "C"):
        return "S" + _slip(" ".join(map(str, (acc, *rest))), rng, p)
    if not rest:
        return "R" + _slip(str(acc), rng, p)
    left, a, b = _slip(" ".join(map(str, rest)), rng, p), _slip(str(acc), rng, p), _slip(str(rest[0]), rng, p)
    return f"[{left}]A{a}+{b}"


def demonstrations(
    tok: Any, *, n: int, modes: Sequence[str], k: int, compact_every: int, slip: float, seed: int
) -> list[Trajectory]:
    """``n`` demonstration episodes per mode, every sample of each, laid out by agentrl's rollout."""
    renderer = ChatRenderer(tok)
    rng = random.Random(seed)
    eot = tok.convert_tokens_to_ids("<e>")

    def turn(prompt_ids: Sequence[int]) -> list[int]:
        context = tok.decode(list(prompt_ids))
        return [*tok.encode(next_turn(context, rng, slip), add_special_tokens=False), eot]

    policy = ScriptedPolicy(turn, stop_ids=renderer.stop_token_ids, logprob=-1.0)
    cfg = RolloutConfig(max_turns=4 * k, max_new_tokens=3 * k + 12, max_total_tokens=4096, audit=False)

    async def run() -> list[Trajectory]:
        out: list[Trajectory] = []
        for mode in modes:
            for i in range(n):
                env = LongChainEnv(k=k, context=mode, compact_every=compact_every)
                out.extend(await run_samples(env, policy, renderer, cfg, seed=seed * 100_000 + i))
        return out

    return asyncio.run(run())


def warm_start(
    out: Path,
    *,
    seed: int,
    steps: int,
    modes: Sequence[str],
    k: int,
    compact_every: int,
    slip: float = 0.02,
    episodes: int = 96,
    batch: int = 32,
    lr: float = 3e-3,
    micro: int = 8,
) -> Path:
    """Train a fresh tiny policy on demonstrations for ``steps`` SFT steps; save it (and its tokenizer)
    as a Hugging Face folder at ``out``. An existing folder is reused."""
    if (out / "config.json").exists():
        return out
    tok = build_tokenizer()
    demos = demonstrations(
        tok, n=episodes, modes=modes, k=k, compact_every=compact_every, slip=slip, seed=seed
    )
    model = tiny_policy(len(tok), seed=seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    model.train()
    for step in range(steps):
        rows = [demos[int(i)] for i in torch.randint(len(demos), (batch,), generator=g)]
        # The same token-mean loss over the batch, computed in micro-batches of similar length: the rows
        # range from about 50 to 400 tokens, and padding all to the longest costs several times the compute.
        rows.sort(key=lambda r: len(r.token_ids))
        n_loss = sum(sum(r.loss_mask[1:]) for r in rows)
        opt.zero_grad()
        n_sum = 0.0
        for lo in range(0, batch, micro):
            part = rows[lo : lo + micro]
            T = max(len(r.token_ids) for r in part)
            ids = torch.zeros((len(part), T), dtype=torch.long)
            mask = torch.zeros((len(part), T))
            for b, r in enumerate(part):
                ids[b, : len(r.token_ids)] = torch.tensor(r.token_ids)
                mask[b, : len(r.loss_mask)] = torch.tensor(r.loss_mask, dtype=torch.float32)
            logits = model(input_ids=ids).logits[:, :-1].float()
            nll = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1), reduction="none"
            )
            part_sum = (nll * mask[:, 1:].reshape(-1)).sum()
            (part_sum / n_loss).backward()
            n_sum += float(part_sum.detach())
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % 50 == 0:
            print(f"  warm start: step {step + 1}/{steps}, loss {n_sum / n_loss:.3f}", flush=True)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out
