"""One small Ray cluster for the whole session, shared by every module of tests/distributed (starting one per
module cost each of seven modules a 3-node start): a head with the learner and inference resources, two nodes
with rollout and sandbox resources (so a node can be removed while the run goes on). A test that changes the
cluster (removes a node) gives it back as it found it; a test never calls ``ray.shutdown``."""

import os

import pytest

HEAD = {"learner": 2, "inference": 2}
ROLLOUT_NODE = {"rollout": 2, "sandbox": 2}
MB = 2**20


def add_rollout_node(cluster):
    return cluster.add_node(num_cpus=1, resources=dict(ROLLOUT_NODE), object_store_memory=80 * MB)


@pytest.fixture(scope="session")
def cluster():
    ray = pytest.importorskip("ray", reason="the Ray tests need the ray extra (bash .ci/setup --dev)")
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 1,
            "resources": dict(HEAD),
            "object_store_memory": 120 * MB,
            "include_dashboard": False,
            "_system_config": {
                # Notice a removed node within seconds, but do not mistake a node slowed by a busy machine
                # for a dead one.
                "health_check_period_ms": 1000,
                "health_check_failure_threshold": 6,
                # Ray starts its workers (every actor) at niceness 15: beside other test workers at 0, on 2
                # cores, the actors got a few percent of a core and the Ray tests waited for the rest of the
                # suite to end (docs/testing.md). At 0 they get their fair share.
                "worker_niceness": 0,
            },
        },
    )
    try:
        add_rollout_node(c)
        add_rollout_node(c)
        c.wait_for_nodes()
        ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
        yield c
    finally:
        ray.shutdown()
        c.shutdown()


@pytest.fixture(scope="session")
def killed_drivers(cluster, tmp_path_factory):
    """The driver-kill tests' runs (killed_drivers.py): a synchronous and an S = 1 driver, each SIGKILLed
    mid-run and resumed, side by side on the session cluster; name -> ``KilledRun``."""
    from .killed_drivers import kill_and_resume

    return kill_and_resume(cluster.address, tmp_path_factory.mktemp("killed-drivers"))
