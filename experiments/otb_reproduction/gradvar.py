"""Exact variance of group policy-gradient estimators, from per-token score Gram matrices.

For one prompt, record M trajectories (the *pool*) and stack the model tokens of all of them (n tokens).
With s_a = ∇_θ log π(y_a | prefix) for token a, the Gram matrix K[a, b] = ⟨s_a, s_b⟩ is everything the
second moments need: a group estimate is ĝ = Σ_a c_a s_a for a coefficient vector c (the estimator's
advantages, 1/N per member), so ‖ĝ − ḡ‖² = (c − c̄)ᵀ K (c − c̄) and ⟨ĝ, u⟩ for u = Σ_a r_a s_a is cᵀ K r.
No proxy enters: K is exact (for the parameters it covers) and the coefficients are exactly what each
estimator produces on the drawn group.

Two ways to get K:

* :func:`gram_full` — every parameter: one backward per token (``torch.autograd.grad`` with a retained
  graph), the per-token gradients stacked into J [n, P], K = J Jᵀ. For the tiny policy.
* :func:`gram_tail` — the parameters after the last position-mixing operation of a Llama-style model: the
  last block's attention output projection, its post-attention RMSNorm and MLP, the final RMSNorm and the
  LM head (for a tied head: its output role only). For those, token t's loss reaches the weights only
  through position t, so its gradient is an outer product g_t a_tᵀ (norms: g_t ⊙ x̂_t) of that position's
  output-gradient and input; one backward of Σ_t log π(y_t) gives every g_t, and
  K = Σ_layers (G Gᵀ) ⊙ (A Aᵀ) + Σ_norms (G ⊙ X̂)(G ⊙ X̂)ᵀ. For SmolLM2-135M (31 M of its 135 M parameters);
  ``tests/experiments`` checks it against per-token autograd on a tiny untied model.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from agentrl.credit import compute_advantages, sum_pi_squared
from agentrl.types import Trajectory


@dataclass(frozen=True)
class PromptPool:
    """One prompt's recorded trajectories, reduced to what the exact variance needs."""

    name: str
    """Which prompt (task id)."""
    rewards: np.ndarray
    """[M] outcome reward of each trajectory."""
    lengths: np.ndarray
    """[M] model tokens of each trajectory."""
    tool_calls: np.ndarray
    """[M] tool calls made by each trajectory."""
    logprobs: np.ndarray
    """[n] log π(y_a) of every model token (trajectory-major order), from the same forward pass."""
    spi2: np.ndarray
    """[n] Σπ² at every model token."""
    tool_turn: np.ndarray
    """[n] True when the token's turn issued a tool call."""
    gram: np.ndarray
    """[n, n] float64 ⟨s_a, s_b⟩ over the covered parameters."""
    blocks: dict[str, np.ndarray] = field(default_factory=dict)
    """[n] squared per-token gradient norm of each parameter block (tail mode), for diagnostics."""

    @property
    def offsets(self) -> np.ndarray:
        """[M + 1] start of each trajectory's tokens in the flat token list."""
        return np.concatenate([[0], np.cumsum(self.lengths)])

    def spans(self) -> list[tuple[int, int]]:
        """[start, end) of each trajectory's tokens in the flat token list."""
        off = self.offsets
        return list(zip(off[:-1].tolist(), off[1:].tolist(), strict=True))

    @property
    def proxy(self) -> np.ndarray:
        """[n] the logit-gradient proxy 1 − 2π + Σπ² (agentrl's cancellation-free form)."""
        from agentrl.credit import token_energy

        return token_energy(torch.from_numpy(self.logprobs), torch.from_numpy(self.spi2)).numpy()

    def restrict(self, keep: np.ndarray) -> PromptPool:
        """The pool of the trajectories selected by the boolean mask ``keep`` [M] (a stratum)."""
        off = self.offsets
        tok = np.concatenate([np.arange(off[i], off[i + 1]) for i in np.flatnonzero(keep)])
        return PromptPool(
            self.name,
            self.rewards[keep],
            self.lengths[keep],
            self.tool_calls[keep],
            self.logprobs[tok],
            self.spi2[tok],
            self.tool_turn[tok],
            self.gram[np.ix_(tok, tok)],
            {k: v[tok] for k, v in self.blocks.items()},
        )


def model_positions(traj: Trajectory) -> np.ndarray:
    """Indices of the sampled tokens (loss mask 1) in the token stream."""
    return np.flatnonzero(np.asarray(traj.loss_mask)) if traj.token_ids else np.zeros(0, dtype=np.int64)


def tool_turn_mask(traj: Trajectory) -> np.ndarray:
    """[model tokens] whether the token belongs to a turn that issued a tool call."""
    from agentrl.types import TokenSource

    call_turns = {r.turn for r in traj.tool_calls}
    out = []
    for s in traj.segments:
        if s.source is TokenSource.MODEL:
            out += [s.turn in call_turns] * (s.end - s.start)
    return np.asarray(out, dtype=bool)


def _logits_stats(logits_T_V: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lsm = torch.log_softmax(logits_T_V.float(), dim=-1)
    return lsm.gather(1, targets[:, None]).squeeze(1), sum_pi_squared(logits_T_V.detach())


def gram_full(model: torch.nn.Module, trajs: Sequence[Trajectory]) -> tuple[np.ndarray, ...]:
    """(K [n, n], logprobs [n], Σπ² [n]) over every trainable parameter, one backward per token."""
    params = [p for p in model.parameters() if p.requires_grad]
    model.eval()
    rows, lps, sps = [], [], []
    for tr in trajs:
        pos = torch.from_numpy(model_positions(tr))
        ids = torch.tensor(tr.token_ids)[None]
        logits = model(input_ids=ids).logits[0]
        lp, sp = _logits_stats(logits[pos - 1], ids[0, pos])
        for k in range(len(pos)):
            g = torch.autograd.grad(lp[k], params, retain_graph=k + 1 < len(pos))
            rows.append(torch.cat([x.reshape(-1) for x in g]))
        lps.append(lp.detach())
        sps.append(sp)
    J = torch.stack(rows)
    K = torch.zeros(J.shape[0], J.shape[0], dtype=torch.float64)
    for c in range(0, J.shape[1], 8192):  # float64 accumulation without a float64 copy of J
        Jc = J[:, c : c + 8192].double()
        K += Jc @ Jc.T
    return K.numpy(), torch.cat(lps).double().numpy(), torch.cat(sps).double().numpy()


def _tail_modules(model: Any) -> tuple[dict[str, torch.nn.Module], dict[str, torch.nn.Module]]:
    layer = model.model.layers[-1]
    linears = {
        "o_proj": layer.self_attn.o_proj,
        "gate_proj": layer.mlp.gate_proj,
        "up_proj": layer.mlp.up_proj,
        "down_proj": layer.mlp.down_proj,
        "lm_head": model.lm_head,
    }
    norms = {"post_attention_norm": layer.post_attention_layernorm, "final_norm": model.model.norm}
    return linears, norms


def tail_parameter_count(model: Any) -> int:
    """How many parameters :func:`gram_tail` covers (a tied head counted once, in its output role)."""
    linears, norms = _tail_modules(model)
    return sum(m.weight.numel() for m in (*linears.values(), *norms.values()))


def gram_tail(model: Any, trajs: Sequence[Trajectory]) -> tuple[np.ndarray, ...]:
    """(K [n, n], logprobs [n], Σπ² [n], per-block squared norms) over the position-wise tail."""
    linears, norms = _tail_modules(model)
    model.eval()
    saved: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    hooks = []

    def leaf(_m: Any, args: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return (args[0].detach().requires_grad_(True), *args[1:])

    def keep(name: str) -> Any:
        def hook(_m: Any, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> None:
            out.retain_grad()
            saved[name] = (args[0], out)

        return hook

    hooks.append(linears["o_proj"].register_forward_pre_hook(leaf))
    for name, mod in {**linears, **norms}.items():
        hooks.append(mod.register_forward_hook(keep(name)))
    req = [p.requires_grad for p in model.parameters()]
    for p in model.parameters():
        p.requires_grad_(False)
    parts: dict[str, list[torch.Tensor]] = {k: [] for k in [*linears, *norms]}
    ins: dict[str, list[torch.Tensor]] = {k: [] for k in linears}
    lps, sps = [], []
    try:
        for tr in trajs:
            pos = torch.from_numpy(model_positions(tr))
            ids = torch.tensor(tr.token_ids)[None]
            with torch.enable_grad():
                logits = model(input_ids=ids).logits[0]
                lp, sp = _logits_stats(logits[pos - 1], ids[0, pos])
                lp.sum().backward()
            at = pos - 1
            for name in linears:
                a, out = saved[name]
                assert out.grad is not None
                ins[name].append(a[0, at].detach().float())
                parts[name].append(out.grad[0, at].float())
            for name, mod in norms.items():
                x, out = saved[name]
                assert out.grad is not None
                x = x[0, at].detach().float()
                eps = float(getattr(mod, "variance_epsilon", 1e-6))
                xhat = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
                parts[name].append(out.grad[0, at].float() * xhat)
            lps.append(lp.detach())
            sps.append(sp)
            saved.clear()
    finally:
        for h in hooks:
            h.remove()
        for p, r in zip(model.parameters(), req, strict=True):
            p.requires_grad_(r)
    n = sum(len(x) for x in lps)
    K = torch.zeros(n, n, dtype=torch.float64)
    blocks = {}
    for name in [*linears, *norms]:
        G = torch.cat(parts[name])
        if name in linears:
            A = torch.cat(ins[name]).double()
            GG = torch.zeros(n, n, dtype=torch.float64)
            for c in range(0, G.shape[1], 8192):
                Gc = G[:, c : c + 8192].double()
                GG += Gc @ Gc.T
            Kb = GG * (A @ A.T)
        else:
            Gd = G.double()
            Kb = Gd @ Gd.T
        K += Kb
        blocks[name] = torch.diagonal(Kb).numpy().copy()
    return K.numpy(), torch.cat(lps).double().numpy(), torch.cat(sps).double().numpy(), blocks


def make_pool(name: str, model: torch.nn.Module, trajs: Sequence[Trajectory], mode: str) -> PromptPool:
    """Score one prompt's trajectories and build its :class:`PromptPool` (``mode``: full | tail)."""
    trajs = [t for t in trajs if not t.infra_failure and t.num_model_tokens > 0]
    if mode == "full":
        K, lp, sp = gram_full(model, trajs)
        blocks: dict[str, np.ndarray] = {}
    elif mode == "tail":
        K, lp, sp, blocks = gram_tail(model, trajs)
    else:
        raise ValueError(f"mode must be 'full' or 'tail', got {mode!r}")
    return PromptPool(
        name,
        np.array([t.reward for t in trajs]),
        np.array([t.num_model_tokens for t in trajs]),
        np.array([len(t.tool_calls) for t in trajs]),
        lp,
        sp,
        np.concatenate([tool_turn_mask(t) for t in trajs]),
        K,
        blocks,
    )


# --------------------------------------------------------------------------------------------------
AGENTRL = {"none": ("none", {}), "grpo": ("grpo", {"norm_by_std": False}), "grpo_std": ("grpo", {})}
AGENTRL |= {"rloo": ("rloo", {}), "opo": ("opo", {}), "otb": ("otb", {})}
EXACT = ("otb_exact", "otb_exact_prefix", "eob", "otb_loo")
ESTIMATORS = (*AGENTRL, *EXACT)
"""``none`` REINFORCE; ``grpo`` group mean (the paper's "group mean"); ``grpo_std`` also divided by the
group std (agentrl's default GRPO; not comparable in scale — use its signal-to-noise); ``rloo``; ``opo``;
``otb`` agentrl's OTB (logit-gradient proxy); ``otb_exact`` the same token baseline with the true per-token
squared gradient norms ‖s_t‖² in place of the proxy (the ceiling OTB approximates); ``otb_exact_prefix``
with the true prefix-score norm ‖Σ_{j≤t} s_j‖² (no orthogonal-increment assumption either); ``eob`` the
exact sequence-level optimal baseline Σ‖S_i‖²R_i / Σ‖S_i‖²."""


def _gather(pool: PromptPool, idx: np.ndarray, flat: np.ndarray, Lmax: int) -> np.ndarray:
    off = pool.offsets[idx][..., None] + np.arange(Lmax)
    mask = np.arange(Lmax) < pool.lengths[idx][..., None]
    return np.where(mask, flat[np.minimum(off, len(flat) - 1)], 0.0)


def token_baseline(
    G: np.ndarray, W: np.ndarray, mask: np.ndarray, eps: float = 1e-8, loo: bool = False
) -> np.ndarray:
    """OTB's group baseline for arbitrary energies: [D, N, L] arrays → [D, N, L] advantages.

    B_k = Σ_n G·W / (Σ_n W + eps) over the members alive at compact index k; where only one member is
    alive (the zero tail, or a group of one) the baseline is 0. Same rules as agentrl's OTB (checked in the
    tests by feeding the proxy energies). ``loo``: each member's sums leave the member itself out.
    """
    m = mask.astype(np.float64)
    num = (G * W * m).sum(1, keepdims=True)
    den = (W * m).sum(1, keepdims=True)
    alive = m.sum(1, keepdims=True)
    if loo:
        num, den, alive = num - G * W * m, den - W * m, alive - m
        base = np.where(alive < 1, 0.0, num / (den + eps))
    else:
        base = np.where(alive <= 1, 0.0, num / (den + eps))
    return (G - base) * m


def advantages(pool: PromptPool, idx: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Advantages [D, N, L] of estimator ``name`` on the groups ``idx`` [D, N] (pool indices), and the
    mask."""
    D, N = idx.shape
    L = pool.lengths[idx]
    Lmax = int(L.max())
    mask = np.arange(Lmax) < L[..., None]
    R = pool.rewards[idx]
    if name in AGENTRL:
        est, opts = AGENTRL[name]
        rew = np.where(np.arange(Lmax) == (L - 1)[..., None], R[..., None], 0.0)
        lp = _gather(pool, idx, pool.logprobs, Lmax)
        sp = _gather(pool, idx, pool.spi2, Lmax)
        flat = (D * N, Lmax)
        A = compute_advantages(
            est,
            torch.from_numpy(rew.reshape(flat)),
            torch.from_numpy(mask.reshape(flat).astype(np.float64)),
            torch.from_numpy(lp.reshape(flat)),
            torch.from_numpy(sp.reshape(flat)),
            torch.arange(D).repeat_interleave(N),
            **opts,
        )
        return A.numpy().reshape(D, N, Lmax), mask
    G = np.where(mask, R[..., None], 0.0)
    if name == "eob":
        sq = np.array([pool.gram[a:b, a:b].sum() for a, b in pool.spans()])
        w = sq[idx]
        b = (w * R).sum(1, keepdims=True) / np.maximum(w.sum(1, keepdims=True), 1e-30)
        b = np.where(N > 1, b, 0.0)
        return (G - b[..., None]) * mask, mask
    if name == "otb_loo":
        W = np.concatenate([np.cumsum(pool.proxy[a:b]) for a, b in pool.spans()])
        return token_baseline(G, _gather(pool, idx, W, Lmax), mask, loo=True), mask
    if name == "otb_exact":
        e = np.diagonal(pool.gram).copy()
        W = np.concatenate([np.cumsum(e[a:b]) for a, b in pool.spans()])
    elif name == "otb_exact_prefix":
        parts = []
        for a, b in pool.spans():
            blk = pool.gram[a:b, a:b]
            parts.append(np.diagonal(np.cumsum(np.cumsum(blk, 0), 1)).copy())
        W = np.concatenate(parts)
    else:
        raise ValueError(f"unknown estimator {name!r}; choose from {ESTIMATORS}")
    return token_baseline(G, _gather(pool, idx, W, Lmax), mask), mask


def coefficients(pool: PromptPool, idx: np.ndarray, A: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """[D, n] token coefficients of ĝ = (1/N) Σ_members Σ_t A_t s_t (seq-mean-token-sum)."""
    D, N, Lmax = A.shape
    n = len(pool.logprobs)
    tok = pool.offsets[idx][..., None] + np.arange(Lmax)
    flat = (np.arange(D)[:, None, None] * n + tok)[mask]
    return np.bincount(flat, weights=A[mask] / N, minlength=D * n).reshape(D, n)


def reference(pool: PromptPool, weights: np.ndarray | None = None) -> np.ndarray:
    """Coefficients of the pool's own gradient estimate Σ_i w_i (R_i − R̄_w) S_i / Σ_i w_i (weights =
    trajectory multiplicities, default all 1): the mean direction the projections are taken on."""
    w = np.ones(len(pool.rewards)) if weights is None else weights
    w = w / w.sum()
    rbar = float((w * pool.rewards).sum())
    c = np.zeros(len(pool.logprobs))
    for i, (a, b) in enumerate(pool.spans()):
        c[a:b] = w[i] * (pool.rewards[i] - rbar)
    return c


def total_variance(K: torch.Tensor, C: np.ndarray) -> float:
    """Tr Cov(ĝ) over the D draws (rows of C): the mean of (c − c̄)ᵀ K (c − c̄), unbiased over draws.

    The product is taken in float32 on centred coefficients (each quadratic form is a sum of non-negative
    eigen-terms, so nothing cancels) and summed in float64.
    """
    Ct = torch.from_numpy(C).float()
    Cc = Ct - Ct.mean(0, keepdim=True)
    q = ((Cc @ K.float()) * Cc).sum(1).double()
    return float(q.sum() / (C.shape[0] - 1))


def projections(C: np.ndarray, K: torch.Tensor, ref: np.ndarray) -> np.ndarray:
    """⟨ĝ_d, u⟩ for every draw, u the unit vector along Σ_a ref_a s_a."""
    Kr = K @ torch.from_numpy(ref)
    norm = max(float(torch.from_numpy(ref) @ Kr), 1e-300) ** 0.5
    return (torch.from_numpy(C) @ Kr).numpy() / norm


def draw(rng: np.random.Generator, weights: np.ndarray, D: int, N: int) -> np.ndarray:
    """[D, N] i.i.d. draws of pool indices with probabilities ∝ ``weights`` (trajectory multiplicities)."""
    p = weights / weights.sum()
    return rng.choice(len(weights), size=(D, N), p=p)
