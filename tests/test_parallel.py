"""The suite's parallel run (pytest-xdist, `-n auto` in the README and CI): tests/conftest.py hands tests out
by group, so that every Ray test runs on the one worker that holds the session cluster, and a module's tests
(and its module-scoped fixture) stay on one worker. Checked on a small generated suite under the real
conftest."""

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


def test_ray_tests_share_one_worker_and_a_module_its_fixture(tmp_path):
    suite, records = tmp_path / "suite", tmp_path / "records"
    (suite / "tests" / "distributed").mkdir(parents=True)
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
    assert "26 passed" in out.stdout, out.stdout[-3000:]
    # -n auto started tests/conftest.py's count of workers, not xdist's one per CPU.
    spec = importlib.util.spec_from_file_location("suite_conftest", CONFTEST)
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    assert set(workers(records, "count")) == {str(conftest.pytest_xdist_auto_num_workers(None))}
    ray = workers(records, "ray")
    assert len(ray) == 6 and len(set(ray)) == 1  # both Ray modules on one worker ...
    assert workers(records, "cluster") == ray[:1]  # ... which started the one cluster
    assert len(workers(records, "module_fixture")) == 1  # the module's fixture ran once
    assert len(set(workers(records, "other")) | set(ray)) >= 2  # and the run was parallel
