"""Dynamic sampling on the Ray runtime, on a real small Ray cluster (scripted math-tir policy on the inference
servers, real envs, the tiny learner): refills are issued groups, a filtered group is dropped in the ledger
with its reason, issued = trained + dropped holds, synchronously and with --max-staleness 1 (the bound holds
with refills in flight)."""

import pytest

from agentrl import read_trajectories
from agentrl.dynamic_sampling import DynamicSampling, GroupVerdict, group_verdict
from agentrl.groups import group_trajectories
from agentrl.metrics import read_metrics
from agentrl.trainers.ray import GroupState, RayOptions

from .scripted import ScriptedTIRFactory
from .test_async_ray import async_config, ledger_of, train

ray = pytest.importorskip("ray", reason="the Ray runtime's tests need the ray extra (bash .ci/setup --dev)")

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("S", [0, 1])
def test_refills_and_filtered_groups_in_the_ledger(cluster, tmp_path, S):
    opts = RayOptions(policy_factory=ScriptedTIRFactory(jitter_s=(0.0, 0.02, 0.05)))
    cfg = async_config(
        tmp_path, f"ds{S}", max_staleness=S, steps=2, dynamic_sampling=DynamicSampling(max_draws=2)
    )
    run = train(cfg, opts)
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [0, 1]
    led = ledger_of(run)
    c = led.check(settled=True)
    groups = list(group_trajectories(read_trajectories(run)))
    no_signal = sum(group_verdict(g) is not GroupVerdict.SIGNAL for g in groups)
    assert sum(r["groups/drawn"] for r in rows) == c["issued"] > 8 - 1  # refills are issued groups
    assert c["trained"] == sum(r["groups/trained"] for r in rows)
    filtered = [e for e in led.entries.values() if e.state is GroupState.DROPPED]
    assert len(filtered) == no_signal == c["issued"] - c["trained"] > 0
    assert all(e.reason.startswith("filtered by dynamic sampling") for e in filtered)
    assert all(r["staleness/max"] <= S for r in rows)
