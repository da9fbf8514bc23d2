"""The suite's parallel run (pytest-xdist, `-n auto` in the README and CI): tests/conftest.py hands tests out
by group, so that every Ray group runs on one worker, next to that worker's own session cluster, and a
module's tests (and its module-scoped fixture) stay on one worker. Checked on a small generated suite under
the real conftest."""

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("xdist", reason="the parallel run needs pytest-xdist (bash .ci/setup --dev)")

CONFTEST = Path(__file__).with_name("conftest.py")

RECORD = """
import os
from pathlib import Path

def record(kind, what="PYTEST_XDIST_WORKER"):
    with open(Path(os.environ["RECORDS"]) / kind, "a") as f:
        f.write(os.environ[what] + "\\n")
"""

CLUSTER = """
import pytest
from tests.record import record

@pytest.fixture(scope="session")
def cluster():
    record("cluster")
"""

RAY_MODULE = """
import time
import pytest
from tests.record import record

@pytest.mark.parametrize("k", range(3))
def test_on_the_cluster(cluster, k):
    record("ray")
    time.sleep(0.05)
"""

MODULE_WITH_FIXTURE = """
import time
import pytest
from tests.record import record

@pytest.fixture(scope="module")
def run():
    record("module_fixture")

@pytest.mark.parametrize("k", range(4))
def test_reads_the_run(run, k):
    time.sleep(0.05)
"""

OTHER_MODULE = """
import time
import pytest
from tests.record import record

@pytest.mark.parametrize("k", range(4))
def test_other(k):
    record("other")
    record("count", "PYTEST_XDIST_WORKER_COUNT")
    time.sleep(0.05)
"""


def workers(records: Path, kind: str) -> list[str]:
    return (records / kind).read_text().split()


def load_conftest():
    spec = importlib.util.spec_from_file_location("suite_conftest", CONFTEST)
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    return conftest


def test_ray_tests_share_one_worker_and_a_module_its_fixture(tmp_path):
    suite, records = tmp_path / "suite", tmp_path / "records"
    (suite / "tests" / "distributed").mkdir(parents=True)
    conftest = load_conftest()
    split = conftest.RAY_GROUPS[0]  # a Ray module that is a group of its own
    records.mkdir()
    shutil.copy(CONFTEST, suite / "tests" / "conftest.py")
    markers = "".join(f"\n    {m}: {m}" for m in ("slow", "ray", "experiment"))
    # testpaths: the controller (which collects nothing) loads tests/conftest.py at start, as in this repo.
    ini = f"[pytest]\ntestpaths = tests\nasyncio_default_fixture_loop_scope = function\nmarkers ={markers}\n"
    (suite / "pytest.ini").write_text(ini)
    files = {
        "tests/__init__.py": "",
        "tests/record.py": RECORD,
        "tests/distributed/__init__.py": "",
        "tests/distributed/conftest.py": CLUSTER,
        "tests/distributed/test_first_ray.py": RAY_MODULE,
        "tests/distributed/test_second_ray.py": RAY_MODULE,
        f"tests/distributed/{split}": RAY_MODULE.replace('record("ray")', 'record("split_ray")'),
        "tests/test_module_fixture.py": MODULE_WITH_FIXTURE,
        **{f"tests/test_other_{i}.py": OTHER_MODULE for i in range(4)},
    }
    for name, text in files.items():
        (suite / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_XDIST_AUTO_NUM_WORKERS"}
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "auto", "-p", "no:cacheprovider"],
        cwd=suite,
        env={**env, "RECORDS": str(records)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "29 passed" in out.stdout, out.stdout[-3000:]
    # -n auto started tests/conftest.py's count of workers, not xdist's one per CPU.
    assert set(workers(records, "count")) == {str(conftest.pytest_xdist_auto_num_workers(None))}
    ray = workers(records, "ray")
    assert len(ray) == 6 and len(set(ray)) == 1  # both Ray modules of the folder's group on one worker ...
    split_ray = workers(records, "split_ray")
    assert len(split_ray) == 3 and len(set(split_ray)) == 1  # ... the split module on one worker ...
    assert split_ray[0] != ray[0]  # ... another one, both handed out first
    assert sorted(workers(records, "cluster")) == sorted([ray[0], split_ray[0]])  # a cluster each, once
    assert len(workers(records, "module_fixture")) == 1  # the module's fixture ran once
    assert len(set(workers(records, "other")) | set(ray)) >= 2  # and the run was parallel


class Item:
    """What ``hand_out_order`` reads of a pytest item: its node id and markers."""

    def __init__(self, nodeid: str, *markers: str) -> None:
        self.nodeid, self.markers = nodeid, markers

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self.markers else None


def test_the_long_groups_are_handed_out_first_and_stay_together():
    conftest = load_conftest()
    split = f"tests/distributed/{conftest.RAY_GROUPS[0]}"
    items = [
        Item("tests/test_a.py::t1"),
        Item("tests/test_b.py::t1"),
        Item("tests/test_b.py::t2"),
        Item("tests/experiments/test_x.py::t", "experiment"),
        Item(f"{split}::t1"),
        Item("tests/test_a.py::t2"),
        Item("tests/sandbox/test_s.py::t"),
        Item("tests/distributed/test_r.py::t1"),
        Item("tests/distributed/test_q.py::t1"),
        Item("tests/distributed/test_r.py::t2"),
        Item(f"{split}::t2"),
        Item("tests/test_b.py::t3"),
    ]
    order = [i.nodeid for i in conftest.hand_out_order(items)]
    assert order == [
        # the Ray groups (the folder's, then the split module: fewer tests), each together and in order
        "tests/distributed/test_r.py::t1",
        "tests/distributed/test_q.py::t1",
        "tests/distributed/test_r.py::t2",
        f"{split}::t1",
        f"{split}::t2",
        # the experiment-scale run and the sandbox tests, in collection order (one test each)
        "tests/experiments/test_x.py::t",
        "tests/sandbox/test_s.py::t",
        # the rest, a module at a time, the one with more tests first
        "tests/test_b.py::t1",
        "tests/test_b.py::t2",
        "tests/test_b.py::t3",
        "tests/test_a.py::t1",
        "tests/test_a.py::t2",
    ]


SLOW_AND_FAST = """
import pytest

def test_fast():
    pass

@pytest.mark.slow
@pytest.mark.parametrize("k", range(2))
def test_slow(k):
    pass
"""


def test_the_fast_tier_lists_the_modules_the_later_tiers_collect(tmp_path):
    """.ci/run: the fast tier's workers write the modules of the tests its ``-m`` left out
    (AGENTRL_LATER_TIERS); the later tier given those modules runs exactly what it runs over the whole
    suite."""
    suite, later = tmp_path / "suite", tmp_path / "later"
    (suite / "tests" / "sub").mkdir(parents=True)
    shutil.copy(CONFTEST, suite / "tests" / "conftest.py")
    ini = "[pytest]\ntestpaths = tests\nasyncio_default_fixture_loop_scope = function\n"
    ini += "markers =\n    slow: slow\n"
    (suite / "pytest.ini").write_text(ini)
    files = {
        "tests/__init__.py": "",
        "tests/sub/__init__.py": "",
        "tests/test_only_fast.py": "def test_a():\n    pass\n",
        "tests/test_mixed.py": SLOW_AND_FAST,
        "tests/sub/test_mixed_too.py": SLOW_AND_FAST,
    }
    for name, text in files.items():
        (suite / name).write_text(text)
    # Not the list of the .ci/run this test may run in (its children would add their modules to it).
    scrubbed = ("PYTEST_XDIST_AUTO_NUM_WORKERS", "AGENTRL_LATER_TIERS")
    env = {k: v for k, v in os.environ.items() if k not in scrubbed}

    def pytest(*args: str, **extra: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "no:cacheprovider", "-rA", *args],
            cwd=suite,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        return out.stdout

    assert "3 passed" in pytest("-m", "not slow", AGENTRL_LATER_TIERS=str(later))
    modules = sorted({Path(p).relative_to(suite).as_posix() for p in later.read_text().split()})
    assert modules == ["tests/sub/test_mixed_too.py", "tests/test_mixed.py"]  # not the fast-only module
    assert len(later.read_text().split()) == 4  # a line per deselected test, from one worker of the two
    passed = {line for line in pytest("-m", "slow", *modules).splitlines() if line.startswith("PASSED")}
    assert passed == {line for line in pytest("-m", "slow").splitlines() if line.startswith("PASSED")}
    assert len(passed) == 4
