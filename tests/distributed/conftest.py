"""One small Ray cluster per test process, shared by the tests of tests/distributed it runs in a row: a head
with the learner and inference resources, two nodes with rollout and sandbox resources (so a node can be
removed while the run goes on). A test that changes the cluster (removes a node) gives it back as it found it;
a test never calls ``ray.shutdown``.

The cluster starts with the first test that asks for it, and stops when the process leaves the folder
(``pytest_runtest_teardown`` below): idle, its daemons take ~0.07 of a core (two raylets' agents, the log
monitor, an idle worker), which the rest of the suite's tier on the same worker would otherwise pay for its
whole length. A later Ray group on the same worker starts it again (7-8 CPU-seconds)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

HEAD = {"learner": 2, "inference": 2}
ROLLOUT_NODE = {"rollout": 2, "sandbox": 2}
MB = 2**20
# Rollout nodes per cluster: two, so that a test can remove one while the run goes on. The child pytest of
# test_session_cluster.py, which checks only when the cluster starts and stops, sets 0 (two raylets and
# their agents fewer to start, twice).
ROLLOUT_NODES_VAR = "AGENTRL_TEST_ROLLOUT_NODES"
HERE = Path(__file__).resolve().parent


def add_rollout_node(cluster):
    return cluster.add_node(num_cpus=1, resources=dict(ROLLOUT_NODE), object_store_memory=80 * MB)


class SessionCluster:
    """The process's ``ray.cluster_utils.Cluster``, connected to, started on demand and stopped on
    ``stop()``. While it runs, its attributes (``address``, ``worker_nodes``, ``add_node``,
    ``remove_node``) are the cluster's, so a session fixture hands out this one object across a stop and a
    start."""

    def __init__(self) -> None:
        self._cluster: Any = None

    def start(self) -> None:
        if self._cluster is not None:
            return
        import ray
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
                    # Notice a removed node within seconds, but do not mistake a node slowed by a busy
                    # machine for a dead one.
                    "health_check_period_ms": 1000,
                    "health_check_failure_threshold": 6,
                    # Ray starts its workers (every actor) at niceness 15: beside other test workers at 0,
                    # on 2 cores, the actors got a few percent of a core and the Ray tests waited for the
                    # rest of the suite to end (docs/testing.md). At 0 they get their fair share.
                    "worker_niceness": 0,
                },
            },
        )
        try:
            for _ in range(int(os.environ.get(ROLLOUT_NODES_VAR, "2"))):
                add_rollout_node(c)
            c.wait_for_nodes()
            ray.init(address=c.address, include_dashboard=False, log_to_driver=False)
        except BaseException:
            c.shutdown()
            raise
        self._cluster = c

    def stop(self) -> None:
        if self._cluster is None:
            return
        import ray

        c, self._cluster = self._cluster, None
        try:
            ray.shutdown()
        finally:
            c.shutdown()

    def __getattr__(self, name: str) -> Any:
        # Never start here: pytest and friends probe objects for attributes (a start at session end would
        # leak a cluster).
        if self._cluster is None or name.startswith("_"):
            raise AttributeError(f"{name!r}: the session cluster is not running (SESSION.start() first)")
        return getattr(self._cluster, name)


SESSION = SessionCluster()


@pytest.fixture(scope="session")
def cluster():
    pytest.importorskip("ray", reason="the Ray tests need the ray extra (bash .ci/setup --dev)")
    SESSION.start()
    yield SESSION
    SESSION.stop()


@pytest.fixture(autouse=True)
def _cluster_running(request: pytest.FixtureRequest) -> None:
    """Start the cluster again for a test that uses it after the process left the folder and came back
    (the session fixture above is set up once)."""
    if "cluster" in request.fixturenames:
        SESSION.start()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """After this folder's last test in a row (the next one elsewhere, or none), stop the cluster."""
    try:
        return (yield)
    finally:
        if nextitem is None or HERE not in nextitem.path.resolve().parents:
            SESSION.stop()


@pytest.fixture(scope="session")
def killed_drivers(cluster, tmp_path_factory):
    """The driver-kill tests' runs (killed_drivers.py): a synchronous and an S = 1 driver, each SIGKILLed
    mid-run and resumed, side by side on the session cluster; name -> ``KilledRun``."""
    from .killed_drivers import kill_and_resume

    SESSION.start()  # set up after the process came back to the folder: the autouse start is later
    return kill_and_resume(cluster.address, tmp_path_factory.mktemp("killed-drivers"))
