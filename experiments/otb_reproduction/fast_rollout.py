"""Lockstep sampler for chain-sum: hundreds of episodes per model call, as agentrl Trajectory records.

Why not ``agentrl.rollout`` + ``HFPolicy`` for the RL runs: with a 0.1 M-parameter model the per-turn
machinery (async episodes, chat-template rendering and its append-only checks, one batch per turn) costs
far more than the model; a run of ~10⁴ episodes took minutes there against seconds here. The semantics are
the same and are checked token for token against the real ToolEnv in ``tests/experiments``:

* every row advances one token per model call (KV cache); a row whose turn ended is fed the tokens the
  environment and template insert (tool output ``<t>…<e>`` and the next ``<a>``) one per call, with loss
  mask 0 and no log-prob, exactly as agentrl's masking rules say;
* the turn's text goes through :class:`tiny_task.ChainParser` and the ``add`` tool; a turn that hits the
  token budget without ``<e>`` ends the episode (truncated, reward 0), as in ``agentrl.rollout``;
* the trajectory is assembled with :func:`agentrl.masking.build_trajectory`, so collate, credit and the
  learner see the same records a real rollout would produce.
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from tiny_task import ChainParser, add, prompt_text, turn_budget

from agentrl.masking import Piece, build_trajectory
from agentrl.models import cache_kwarg, output_cache
from agentrl.types import Message, StopReason, TokenSource, ToolRecord, ToolStatus, Trajectory, TrajectoryMeta

_PARSER = ChainParser()


@dataclass(frozen=True)
class Vocab:
    """The control-token ids and the char → id table of the tiny tokenizer."""

    ids: dict[str, int]
    pad: int
    user: int
    asst: int
    tool: int
    eot: int

    @classmethod
    def of(cls, tokenizer: object) -> Vocab:
        """Read them from the tokenizer."""
        ids = dict(tokenizer.get_vocab())  # type: ignore[attr-defined]
        return cls(ids, ids["<pad>"], ids["<u>"], ids["<a>"], ids["<t>"], ids["<e>"])

    def encode(self, text: str) -> list[int]:
        """Characters to ids (the tokenizer is one token per character)."""
        return [self.ids[c] for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        """Ids to text (control tokens dropped)."""
        inv = {v: k for k, v in self.ids.items()}
        return "".join(inv[i] for i in ids if len(inv[i]) == 1)


@dataclass
class _Row:
    numbers: list[int]
    pieces: list[Piece]
    messages: list[Message]
    turn_ids: list[int]
    turn_lps: list[float]
    forced: list[int]
    turns: int = 0
    done: bool = False
    reward: float = 0.0
    stop: StopReason = StopReason.TERMINATED
    truncated: bool = False
    records: list[ToolRecord] = field(default_factory=list)


@torch.no_grad()
def sample_episodes(
    model: torch.nn.Module,
    vocab: Vocab,
    prompts: Sequence[Sequence[int]],
    *,
    generator: torch.Generator,
    temperature: float = 1.0,
    greedy: bool = False,
    build: bool = True,
    script: Sequence[Sequence[Sequence[int]]] | None = None,
) -> tuple[list[Trajectory], np.ndarray]:
    """Run one episode per entry of ``prompts`` (each a list of numbers, all of the same K).

    ``script`` (for tests): per row, the token ids of each model turn to emit instead of sampling (with
    log-prob −0.5, as ``agentrl.testing.ScriptedPolicy``). Returns (trajectories — empty when ``build`` is
    False —, rewards as a float array).
    """
    k = len(prompts[0])
    if any(len(p) != k for p in prompts):
        raise ValueError("all prompts of a batch must have the same number of numbers")
    budget, max_turns = turn_budget(k), k + 1
    rows = []
    for nums in prompts:
        text = prompt_text(nums)
        ids = [vocab.user, *vocab.encode(text), vocab.eot, vocab.asst]
        r = _Row(
            list(nums), [Piece(TokenSource.PROMPT, tuple(ids), -1, 0)], [Message("user", text)], [], [], []
        )
        rows.append(r)
    was_training = model.training
    model.eval()
    first = torch.tensor([list(r.pieces[0].token_ids) for r in rows], dtype=torch.long)
    out = model(input_ids=first, use_cache=True)
    cache = output_cache(out)
    cache_kw = cache_kwarg(model)
    logits = out.logits[:, -1, :].float()
    B = len(rows)
    step_tokens = torch.empty(B, dtype=torch.long)
    max_len = first.shape[1] + max_turns * (budget + 12)
    for _ in range(max_len):
        if all(r.done for r in rows):
            break
        logp = torch.log_softmax(logits / temperature, dim=-1)
        if greedy:
            choice = logp.argmax(dim=-1)
        else:
            choice = torch.multinomial(logp.exp(), 1, generator=generator).squeeze(1)
        chosen_lp = logp.gather(1, choice[:, None]).squeeze(1).tolist()
        choice_l = choice.tolist()
        for i, r in enumerate(rows):
            if r.done:
                step_tokens[i] = vocab.pad
            elif r.forced:
                step_tokens[i] = r.forced.pop(0)
            else:
                tok, lp = choice_l[i], min(chosen_lp[i], 0.0)
                if script is not None:
                    turn = script[i][r.turns % len(script[i])]
                    tok, lp = turn[len(r.turn_ids)], -0.5
                step_tokens[i] = tok
                r.turn_ids.append(tok)
                r.turn_lps.append(lp)
                if tok == vocab.eot or len(r.turn_ids) >= budget:
                    _end_turn(r, vocab, max_turns)
        out = model(input_ids=step_tokens[:, None].clone(), use_cache=True, **{cache_kw: cache})
        cache = output_cache(out)
        logits = out.logits[:, -1, :].float()
    model.train(was_training)
    rewards = np.array([r.reward for r in rows], dtype=np.float64)
    if not build:
        return [], rewards
    return [_to_trajectory(r) for r in rows], rewards


def _end_turn(r: _Row, vocab: Vocab, max_turns: int) -> None:
    """The environment's side of a finished model turn (ChainSumEnv.step, inlined)."""
    ids, lps = r.turn_ids, r.turn_lps
    r.turn_ids, r.turn_lps = [], []
    r.pieces.append(Piece.sampled(ids, lps, r.turns, len(r.messages)))
    text = vocab.decode(ids[:-1] if ids[-1] == vocab.eot else ids)
    r.messages.append(Message("assistant", text))
    r.turns += 1
    if ids[-1] != vocab.eot:  # cut by the token budget: agentrl.rollout ends such an episode
        r.done, r.truncated, r.stop = True, True, StopReason.TURN_TOKENS
        return
    parsed = _PARSER.parse(text, id_prefix=f"call_{r.turns - 1}")
    if not parsed.has_calls:
        ans = parsed.answer
        r.reward = float(ans is not None and int(ans) == sum(r.numbers))
        r.done = True
        return
    call = parsed.calls[0]
    result = add.fn(**json.loads(call.arguments))
    r.records.append(ToolRecord(call.id, "A", call.arguments, result, ToolStatus.OK, 0.0, r.turns - 1))
    if r.turns >= max_turns:  # agentrl.rollout: the env ran the call, but the episode ends before its output
        r.done, r.truncated, r.stop = True, True, StopReason.MAX_TURNS
        return
    obs = [vocab.tool, *vocab.encode(result), vocab.eot]
    r.pieces.append(Piece(TokenSource.OBSERVATION, tuple(obs), r.turns - 1, len(r.messages)))
    r.pieces.append(Piece(TokenSource.TEMPLATE, (vocab.asst,), r.turns - 1))
    r.messages.append(Message("tool", result, tool_call_id=call.id, name="A"))
    r.forced = [*obs, vocab.asst]


def _to_trajectory(r: _Row) -> Trajectory:
    # One weights version per batch: every turn gets meta.policy_version (the builder's default).
    return build_trajectory(
        r.pieces,
        messages=r.messages,
        meta=TrajectoryMeta(env_id="chain-sum"),
        rewards=(r.reward,),
        stop_reason=r.stop,
        terminated=not r.truncated,
        truncated=r.truncated,
        tool_calls=r.records,
    )


def group_rollout(
    model: torch.nn.Module,
    vocab: Vocab,
    prompts: Sequence[Sequence[int]],
    group_size: int,
    *,
    generator: torch.Generator,
    step: int = 0,
    task_seeds: Sequence[int] | None = None,
) -> list[Trajectory]:
    """``group_size`` episodes per prompt; members of a prompt share a ``group_id`` (and ``task_id``).

    ``task_seeds``: the task seed each prompt was made from, recorded as ``meta.seed`` (what the trainer's
    :class:`~agentrl.trainers.task_sampler.TaskSampler` reads back when it observes the groups)."""
    if task_seeds is not None and len(task_seeds) != len(prompts):
        raise ValueError(f"{len(task_seeds)} task seeds for {len(prompts)} prompts")
    flat = [p for p in prompts for _ in range(group_size)]
    trajs, _ = sample_episodes(model, vocab, flat, generator=generator)
    out = []
    gids = [uuid.uuid4().hex for _ in prompts]
    for j, t in enumerate(trajs):
        g = j // group_size
        meta = TrajectoryMeta(
            env_id="chain-sum",
            seed=None if task_seeds is None else int(task_seeds[g]),
            task_id=prompt_text(prompts[g]),
            group_id=gids[g],
            step=step,
            episode_id=f"{gids[g]}-{j % group_size}",
        )
        out.append(dataclasses.replace(t, meta=meta))
    return out
