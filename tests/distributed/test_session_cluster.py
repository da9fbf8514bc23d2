"""The per-process Ray cluster of tests/distributed (conftest.py): started by the first test that asks for it,
shared by the folder's tests that run in a row, stopped when the process leaves the folder, started again
when it comes back. Checked on a small generated suite under the real conftest, in a child pytest."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import ROLLOUT_NODES_VAR

pytest.importorskip("ray", reason="the session cluster needs the ray extra (bash .ci/setup --dev)")

pytestmark = [pytest.mark.slow, pytest.mark.ray]

ON_THE_CLUSTER = """
import json, os
import ray

def test_{name}(cluster, k=0):
    assert ray.is_initialized()
    with open(os.environ["RECORDS"], "a") as f:
        f.write(json.dumps({{"test": "{name}", "address": cluster.address}}) + "\\n")
"""

ELSEWHERE = """
import json, os
import ray

def test_elsewhere():
    with open(os.environ["RECORDS"], "a") as f:
        f.write(json.dumps({"test": "elsewhere", "ray": ray.is_initialized()}) + "\\n")
"""


def test_the_cluster_stops_when_the_process_leaves_the_folder_and_starts_when_it_returns(tmp_path):
    folder = tmp_path / "tests" / "distributed"
    folder.mkdir(parents=True)
    (tmp_path / "tests" / "__init__.py").write_text("")
    (folder / "__init__.py").write_text("")
    shutil.copy(Path(__file__).with_name("conftest.py"), folder / "conftest.py")
    (folder / "test_a.py").write_text(ON_THE_CLUSTER.format(name="a1") + ON_THE_CLUSTER.format(name="a2"))
    (folder / "test_c.py").write_text(ON_THE_CLUSTER.format(name="c"))
    (tmp_path / "tests" / "other").mkdir()
    (tmp_path / "tests" / "other" / "test_b.py").write_text(ELSEWHERE)
    records = tmp_path / "records.jsonl"
    order = ["tests/distributed/test_a.py", "tests/other/test_b.py", "tests/distributed/test_c.py"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *order],
        cwd=tmp_path,
        env={**os.environ, "RECORDS": str(records), ROLLOUT_NODES_VAR: "0"},  # a head is enough here
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in records.read_text().splitlines()]
    assert [r["test"] for r in rows] == ["a1", "a2", "elsewhere", "c"]
    a1, a2, elsewhere, c = rows
    assert a1["address"] == a2["address"]  # one start for the tests in a row
    assert elsewhere["ray"] is False  # stopped (ray.shutdown) on leaving the folder
    assert c["address"] != a1["address"]  # a new cluster on coming back
