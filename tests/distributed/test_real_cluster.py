"""Real tier (opt-in: AGENTRL_RAY_CLUSTER=1): a 2-node Ray cluster started with `ray start`, and
`agentrl train --ray auto` on SmolLM2 for 2 steps with the real sandbox, as docs/distributed.md describes
(AGENTRL_RAY_CLUSTER_MODEL=tiny runs the same with the tiny model, to check the cluster set-up quickly).

The head offers the learner and inference resources, the second node the rollout and sandbox resources; both
run on this machine with their own ports. Only the processes of this cluster are stopped afterwards (found
by its own temp folder), never other Ray instances on the machine.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from agentrl import read_trajectories
from agentrl.metrics import read_metrics
from agentrl.run import RunDir

pytestmark = [
    pytest.mark.ray_cluster,
    pytest.mark.ray,
    pytest.mark.skipif(os.environ.get("AGENTRL_RAY_CLUSTER") != "1", reason="opt-in: AGENTRL_RAY_CLUSTER=1"),
]
BIN = Path(sys.executable).parent


def ray_cli(*args, env):
    out = subprocess.run([str(BIN / "ray"), *args], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    return out


def stop_cluster(temp_dir: str) -> None:
    """SIGKILL the processes whose command line names this cluster's temp folder (ours only)."""
    me = os.getpid()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == me:
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if temp_dir in cmd:
            try:
                os.kill(int(proc.name), signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_two_node_cluster_trains_smollm2_for_two_steps(tmp_path):
    temp_dir = tempfile.mkdtemp(prefix="agentrl-ray-", dir="/tmp")
    port = 26379 + os.getpid() % 1000
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    common = ["--num-cpus", "1", "--disable-usage-stats"]
    try:
        ray_cli(
            "start",
            "--head",
            f"--port={port}",
            f"--temp-dir={temp_dir}",
            "--include-dashboard=false",
            "--resources",
            json.dumps({"learner": 1, "inference": 1}),
            *common,
            env=env,
        )
        ray_cli(
            "start",
            f"--address=127.0.0.1:{port}",
            "--resources",
            json.dumps({"rollout": 2, "sandbox": 2}),
            "--node-manager-port=0",
            "--object-manager-port=0",
            *common,
            env=env,
        )
        run = tmp_path / "smollm2"
        t0 = time.perf_counter()
        out = subprocess.run(
            [
                str(BIN / "agentrl"),
                "train",
                "--ray",
                "auto",
                "--model",
                os.environ.get("AGENTRL_RAY_CLUSTER_MODEL", "smollm2"),
                "--steps",
                "2",
                "--groups-per-step",
                "2",
                "--group-size",
                "2",
                "--rollout.max-new-tokens",
                "64",
                "--no-progress",
                "--out",
                str(run),
            ],
            capture_output=True,
            text=True,
            timeout=1800,
            env={**env, "RAY_ADDRESS": f"127.0.0.1:{port}"},
        )
        wall = time.perf_counter() - t0
        print(out.stdout[-4000:], out.stderr[-2000:], f"wall {wall:.0f}s", sep="\n")
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        rows = read_metrics(run)
        assert [r["step"] for r in rows] == [0, 1]
        trajs = list(read_trajectories(run))
        assert len(trajs) == 8
        nodes = {t.meta.provenance.node for t in trajs}
        assert len(nodes) == 1  # every episode on the rollout node (the head offers no rollout resource)
        assert all(t.meta.provenance.server == "server-0" for t in trajs)
        assert RunDir(run).latest_checkpoint() is not None
        summary = {
            "wall_s": round(wall, 1),
            "steps": [
                {
                    k: r[k]
                    for k in (
                        "reward/mean",
                        "tools/calls_per_episode",
                        "time/rollout_s",
                        "time/learn_s",
                        "ray/groups_issued",
                    )
                    if k in r
                }
                for r in rows
            ],
        }
        (Path(os.environ.get("AGENTRL_RAY_CLUSTER_OUT", tmp_path)) / "real_cluster.json").write_text(
            json.dumps(summary, indent=1)
        )
    finally:
        stop_cluster(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
