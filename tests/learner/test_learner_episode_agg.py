"""Loss aggregation over multi-sample episodes: the episode-normalised options, by hand and in a step."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from agentrl.errors import ConfigError
from agentrl.learner import Learner, LearnerConfig
from agentrl.learner.aggregation import LOSS_AGGS, aggregation_weights, episode_counts

from .test_learner_step import advantages, current_logprobs, make_batch
from .tiny import tiny_llama

# make_batch's rows have 3, 4, 2 and 3 model tokens; rows 0 and 1 become the two samples of one episode.
EPISODES = (0, 0, 1, 2)


def weights(agg, mask, episode_ids):
    seq = mask.sum(dim=1)
    ep_tok, n_ep = episode_counts(seq, episode_ids)
    return aggregation_weights(
        mask,
        agg,
        n_tokens=float(seq.sum()),
        n_sequences=float((seq > 0).sum()),
        n_episodes=n_ep,
        episode_tokens_B=ep_tok,
    )


def test_episode_mean_token_mean_weighs_every_episode_the_same():
    mask = make_batch().loss_mask_B_T
    w = weights("episode-mean-token-mean", mask, EPISODES)
    per_episode = [float(w[:2].sum()), float(w[2].sum()), float(w[3].sum())]
    assert per_episode == pytest.approx([1 / 3] * 3)
    # Its 7 tokens share the first episode's third equally, whichever sample they are in.
    assert w[:2][mask[:2] != 0].tolist() == pytest.approx([1 / 21] * 7)
    # seq-mean-token-mean counts the two samples as two sequences: the split episode gets half the batch.
    s = weights("seq-mean-token-mean", mask, EPISODES)
    assert float(s[:2].sum()) == pytest.approx(0.5)
    # episode-mean-token-sum: 1 / episodes per token.
    w_sum = weights("episode-mean-token-sum", mask, EPISODES)
    assert w_sum[mask != 0].tolist() == pytest.approx([1 / 3] * 12)


def test_one_sample_per_episode_equals_the_seq_options_exactly():
    mask = make_batch().loss_mask_B_T
    for ids in (None, (0, 1, 2, 3), (7, 3, 5, 1)):
        assert torch.equal(
            weights("episode-mean-token-mean", mask, ids), weights("seq-mean-token-mean", mask, ids)
        )
        assert torch.equal(
            weights("episode-mean-token-sum", mask, ids), weights("seq-mean-token-sum", mask, ids)
        )


def test_rows_without_model_tokens_are_not_counted():
    mask = make_batch().loss_mask_B_T.clone()
    mask[3] = 0
    w = weights("episode-mean-token-mean", mask, EPISODES)
    assert float(w.sum()) == pytest.approx(1.0) and float(w[3].sum()) == 0


def test_bad_inputs():
    mask = make_batch().loss_mask_B_T
    with pytest.raises(ConfigError, match="episode ids for"):
        episode_counts(mask.sum(dim=1), (0, 1))
    with pytest.raises(ConfigError, match="loss_agg must be one of"):
        weights("episode-mean", mask, None)
    with pytest.raises(ConfigError, match="loss_agg"):
        LearnerConfig(loss_agg="episode-mean")  # type: ignore[arg-type]
    assert "episode-mean-token-mean" in LOSS_AGGS


def test_learner_step_loss_is_the_episode_mean_of_token_means():
    """REINFORCE at ratio 1: the reported policy loss is Σ_e (1/E)·mean over e's tokens of −A·log π."""
    model = tiny_llama(seed=1)
    batch = dataclasses.replace(make_batch(), episode_ids=EPISODES)
    lp0, _ = current_logprobs(model, batch)
    batch = dataclasses.replace(batch, old_logprobs_B_T=lp0 * batch.loss_mask_B_T)
    adv = advantages(batch)
    cfg = LearnerConfig(loss_agg="episode-mean-token-mean", policy_loss="reinforce", micro_batch_tokens=12)
    stats = Learner(model, cfg).step(batch, adv)
    m = batch.loss_mask_B_T != 0
    per_tok = -adv * lp0
    eps = [per_tok[:2][m[:2]].mean(), per_tok[2][m[2]].mean(), per_tok[3][m[3]].mean()]
    assert stats.loss == pytest.approx(float(sum(eps) / 3), abs=1e-5)
    # Without the episode ids the same option is seq-mean-token-mean (four sequences).
    model = tiny_llama(seed=1)
    plain = Learner(model, cfg).step(dataclasses.replace(batch, episode_ids=()), adv)
    seqs = [per_tok[b][m[b]].mean() for b in range(4)]
    assert plain.loss == pytest.approx(float(sum(seqs) / 4), abs=1e-5)
