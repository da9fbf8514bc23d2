"""The renamed trainer modules (#41: ``pg`` → ``train``, ``distributed`` → ``ray``) keep their old import
paths until 0.2.0 as the very same module objects (trainers/__init__.py, ``MOVED_MODULES``)."""

import importlib
import pickle
import subprocess
import sys
from unittest import mock

import pytest

import agentrl.trainers.ray.ledger as ledger
import agentrl.trainers.ray.runtime as runtime
import agentrl.trainers.train as train
from agentrl.trainers import MOVED_MODULES, moved_to


def test_an_old_name_is_the_new_module_object():
    assert importlib.import_module("agentrl.trainers.pg") is train
    assert importlib.import_module("agentrl.trainers.distributed") is importlib.import_module(
        "agentrl.trainers.ray"
    )
    old = importlib.import_module("agentrl.trainers.distributed.runtime")
    assert old is runtime and sys.modules["agentrl.trainers.ray.runtime"] is runtime
    # The module keeps its own name and spec: a second copy under the old name would have its own classes.
    assert (runtime.__name__, runtime.__spec__.name) == ("agentrl.trainers.ray.runtime",) * 2
    from agentrl.trainers.distributed.runtime import RayOptions
    from agentrl.trainers.pg import TrainConfig

    assert RayOptions is runtime.RayOptions and TrainConfig is train.TrainConfig
    assert moved_to("agentrl.trainers.distributed.actors") == "agentrl.trainers.ray.actors"
    assert moved_to("agentrl.trainers.pgx") is None and moved_to("agentrl.trainers.train") is None
    assert set(MOVED_MODULES) == {"agentrl.trainers.pg", "agentrl.trainers.distributed"}


def test_a_patch_through_an_old_name_patches_the_real_object():
    with mock.patch("agentrl.trainers.distributed.runtime.connect") as fake:
        assert runtime.connect is fake
    with mock.patch("agentrl.trainers.pg.prepare_run") as fake:
        assert train.prepare_run is fake
    assert not isinstance(runtime.connect, mock.Mock) and not isinstance(train.prepare_run, mock.Mock)


def test_a_pickle_naming_the_old_path_loads_and_new_pickles_name_the_new_one():
    state = next(iter(ledger.GroupState))
    new = pickle.dumps(state, protocol=0)
    assert b"agentrl.trainers.ray.ledger" in new and b"distributed" not in new
    old = new.replace(b"agentrl.trainers.ray.ledger", b"agentrl.trainers.distributed.ledger")
    assert pickle.loads(old) is state


def test_a_missing_module_under_an_old_name_is_python_s_own_error():
    with pytest.raises(ModuleNotFoundError, match=r"agentrl\.trainers\.distributed\.nothing"):
        importlib.import_module("agentrl.trainers.distributed.nothing")


def test_old_names_import_in_a_fresh_process_without_a_warning():
    # -W error: a DeprecationWarning at import would fail every pytest run that still uses an old name.
    code = (
        "import sys, agentrl.trainers.distributed.runtime as a, agentrl.trainers.pg as b;"
        "import agentrl.trainers.ray.runtime as c, agentrl.trainers.train as d;"
        "assert a is c and b is d and 'ray' not in sys.modules, sorted(sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
