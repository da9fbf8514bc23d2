"""The weight-update seam: WeightUpdate, HFPolicy as a sink (shared model or a copy), the shipped fake, and
the trainer's publish step, which uses nothing but the Protocol."""

from __future__ import annotations

import pytest
import torch

from agentrl.errors import ConfigError
from agentrl.models import tiny_model
from agentrl.policies import HFPolicy, OpenAIPolicy
from agentrl.protocols import Sampling, UpdatablePolicy, WeightSink, WeightUpdate
from agentrl.testing import RecordingWeightSink, ScriptedPolicy


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_a_weight_update_is_validated_and_read_only():
    w = {"a": torch.zeros(2)}
    update = WeightUpdate(3, w)
    w["b"] = torch.ones(1)  # the caller's dict changing later does not change the update
    assert list(update.named_tensors) == ["a"]
    with pytest.raises(TypeError):
        update.named_tensors["c"] = torch.ones(1)  # type: ignore[index]
    for version in (-1, 1.5, True):
        with pytest.raises(ConfigError, match="version"):
            WeightUpdate(version, w)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="at least one"):
        WeightUpdate(1, {})
    update.check_after(3)  # the same version again: a resync
    with pytest.raises(ConfigError, match="stale"):
        update.check_after(4)


def test_which_policies_take_weights(model, tok):
    assert isinstance(HFPolicy(model, tok), UpdatablePolicy)
    served = OpenAIPolicy("http://127.0.0.1:1/v1", "m", client=object())
    assert not isinstance(served, WeightSink)  # the completions API has no route for weights
    assert isinstance(RecordingWeightSink(ScriptedPolicy([[1]])), UpdatablePolicy)


async def test_hf_policy_sharing_the_learners_model_only_takes_the_version(tok, renderer):
    learner_model = tiny_model(tok, seed=3)
    policy = HFPolicy(learner_model, tok, stop_token_ids=renderer.stop_token_ids, version=4)
    with torch.no_grad():  # the learner's step changes the shared tensors in place
        for p in learner_model.parameters():
            p.mul_(0.5)
    expected = _weights(learner_model)
    await policy.load_weights(WeightUpdate(5, learner_model.state_dict()))
    assert policy.version == 5 and policy.model is learner_model
    for name, value in policy.model.state_dict().items():
        assert torch.equal(value, expected[name]), name
    g = await policy.generate(renderer.encode("a"), Sampling(max_new_tokens=3, seed=0))
    assert g.policy_version == 5


async def test_hf_policy_with_its_own_model_copies_the_update_in(tok, renderer):
    """A sampler holding a different model object (another device, another copy) gets the learner's
    weights copied in: afterwards it samples exactly what the learner's weights sample."""
    learner_model = tiny_model(tok, seed=1)
    sampler = HFPolicy(tiny_model(tok, seed=2), tok, stop_token_ids=renderer.stop_token_ids)
    reference = HFPolicy(learner_model, tok, stop_token_ids=renderer.stop_token_ids)
    prompt, sampling = renderer.encode("hello there"), Sampling(max_new_tokens=8, seed=7)
    before = await sampler.generate(prompt, sampling)
    want = await reference.generate(prompt, sampling)
    assert before.logprobs != want.logprobs  # different weights, different distribution

    await sampler.load_weights(WeightUpdate(1, learner_model.state_dict()))
    assert sampler.version == 1 and sampler.model is not learner_model
    got = await sampler.generate(prompt, sampling)
    assert got.token_ids == want.token_ids and got.logprobs == want.logprobs
    assert got.policy_version == 1
    with torch.no_grad():  # a copy, not an alias: the learner moving on does not move the sampler
        next(learner_model.parameters()).add_(1.0)
    assert not torch.equal(next(learner_model.parameters()), next(sampler.model.parameters()))


async def test_hf_policy_refuses_stale_or_misfitting_updates(tok):
    policy = HFPolicy(tiny_model(tok, seed=0), tok, version=3)
    weights = _weights(policy.model)
    with pytest.raises(ConfigError, match="stale"):
        await policy.load_weights(WeightUpdate(2, weights))
    with pytest.raises(ConfigError, match="does not have"):
        await policy.load_weights(WeightUpdate(4, {"lm_head.bias": torch.zeros(3)}))
    name = next(iter(weights))
    with pytest.raises(ConfigError, match=name):
        await policy.load_weights(WeightUpdate(4, {name: torch.zeros(1, 1)}))
    assert policy.version == 3  # nothing was taken


async def test_the_fake_sink_records_copies_and_stamps_its_version():
    sink = RecordingWeightSink(ScriptedPolicy([[5, 6]], version=0))
    w = torch.ones(2)
    await sink.load_weights(WeightUpdate(1, {"w": w}))
    w.add_(1.0)  # the learner moves on; the recorded update keeps what was published
    await sink.load_weights(WeightUpdate(2, {"w": w}))
    assert [u.version for u in sink.updates] == [1, 2]
    assert sink.updates[0].named_tensors["w"].tolist() == [1.0, 1.0]
    assert sink.updates[1].named_tensors["w"].tolist() == [2.0, 2.0]
    g = await sink.generate([1], Sampling(max_new_tokens=4))
    assert g.token_ids == (5, 6) and g.policy_version == 2
    with pytest.raises(ConfigError, match="stale"):
        await sink.load_weights(WeightUpdate(1, {"w": w}))
    with pytest.raises(ConfigError, match="wraps no policy"):
        await RecordingWeightSink().generate([1], Sampling())


async def test_the_trainer_publishes_through_the_protocol(tok):
    from agentrl.trainers.train_setup import publish_weights

    model = tiny_model(tok, seed=0)
    sink = RecordingWeightSink()
    await publish_weights(sink, model, 7)
    (update,) = sink.updates
    assert update.version == 7 and sink.version == 7
    state = model.state_dict()
    assert list(update.named_tensors) == list(state)
    assert all(torch.equal(update.named_tensors[k], v) for k, v in state.items())
