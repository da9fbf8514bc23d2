"""What a rollout worker or inference server loads must not import torch or transformers; nor may
``agentrl``'s command-line parser import torch.

Those actors unpickle the run's TrainConfig and build their env and renderer from
:mod:`agentrl.trainers.factories`, but never train: torch and transformers' model code would cost each of
them ~3 CPU-s and ~300 MB. Each case runs in a fresh interpreter whose meta-path hook records where each
watched module was first asked for, so a regression names the import chain that brought it back.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.learner import LearnerConfig
from agentrl.rollout import RolloutConfig
from agentrl.trainers import train_setup
from agentrl.trainers.evaluate import EvalConfig

HEAVY = ("torch", "transformers")


def schema_mirror_active() -> bool:
    """Whether @tool schemas are built without torch here (tools/_schema.py's gate)."""
    from agentrl.tools import _schema

    return _schema.installed_source_hash() == _schema.MIRRORED_SOURCE


# Runs the statement argv[2] (argv[3:] are its arguments) and prints, for each watched module (argv[1], a
# JSON list) that ended up in sys.modules, the frames (file:line) that first imported it, innermost last.
_CHILD = r"""
import json, sys, traceback

watched, stmt = json.loads(sys.argv[1]), sys.argv[2]
first = {}


class Watch:
    def find_spec(self, name, path=None, target=None):
        if name in watched and name not in first:
            first[name] = [
                f"{f.filename}:{f.lineno}"
                for f in traceback.extract_stack()[:-1]
                if not f.filename.startswith("<") and "importlib" not in f.filename
            ]
        return None


sys.meta_path.insert(0, Watch())
exec(stmt)
seen = {name: first.get(name, ["(no import statement seen)"]) for name in watched if name in sys.modules}
print(json.dumps(seen))
"""


def imported(stmt: str, *args: str, watched: tuple[str, ...] = HEAVY) -> dict[str, list[str]]:
    """The ``watched`` modules a fresh interpreter has after running ``stmt``, each with its import chain."""
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(watched), stmt, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{stmt!r} failed in a fresh interpreter:\n{done.stderr}"
    found: dict[str, list[str]] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def assert_light(stmt: str, found: dict[str, list[str]]) -> None:
    """Fail naming the chain that imported each heavy module."""
    heavy = {name: chain for name, chain in found.items() if name in HEAVY}
    assert not heavy, f"{stmt!r} imports " + "; ".join(
        f"{name}, first via:\n    " + "\n    ".join(chain) for name, chain in heavy.items()
    )


def test_train_config_imports_no_torch() -> None:
    stmt = "import agentrl.trainers.train_config"
    found = imported(stmt, watched=(*HEAVY, "agentrl.credit.estimators"))
    assert_light(stmt, found)
    # The hook sees imports at all: the estimator configs come in through train_config.
    assert any("train_config.py" in frame for frame in found["agentrl.credit.estimators"]), found


def test_factories_import_no_torch() -> None:
    stmt = "import agentrl.trainers.factories"
    assert_light(stmt, imported(stmt))


def test_unpickling_a_train_config_imports_no_torch(tmp_path: Path) -> None:
    # The config the Ray runtime's tests hand their actors (tests/distributed/test_ray_runtime.py).
    cfg = train_setup.TrainConfig(
        model="tiny",
        env="math-tir-arith-v0",
        group_size=2,
        groups_per_step=4,
        steps=1,
        out=str(tmp_path / "run"),
        rollout=RolloutConfig(
            max_turns=3, max_new_tokens=48, concurrency=4, on_template_mismatch="stop", seed=3
        ),
        learner=LearnerConfig(lr=1e-3),
        progress=False,
        deploy=train_setup.DeployConfig(ray="auto"),
        eval=EvalConfig(tasks=0),
    )
    path = tmp_path / "config.pkl"
    path.write_bytes(pickle.dumps(cfg))
    stmt = (
        "import pickle, sys; cfg = pickle.loads(open(sys.argv[3], 'rb').read()); assert cfg.model == 'tiny'"
    )
    assert_light("pickle.loads(TrainConfig)", imported(stmt, str(path)))


@pytest.mark.skipif(
    not schema_mirror_active(),
    reason="the installed transformers is not the release tools/_schema.py mirrors: @tool schemas (the "
    "parser imports the calculator tool) come from get_json_schema, which imports torch",
)
def test_every_agentrl_command_parses_without_torch() -> None:
    # `agentrl envs`, `agentrl check`, `agentrl --help` build the whole parser, `agentrl replay`'s included:
    # torch comes only with a command that runs a model (the replay package loads its model parts lazily).
    stmt = "from agentrl.trainers.cli import build_parser; build_parser()"
    found = imported(stmt, watched=("torch", "agentrl.trainers.replay.cli"))
    assert "agentrl.trainers.replay.cli" in found, found  # the hook saw the replay parser come in
    assert_light(stmt, {k: v for k, v in found.items() if k == "torch"})


@pytest.mark.parametrize(
    "module",
    [
        "agentrl.credit",
        "agentrl.credit.estimators",
        "agentrl.learner",
        "agentrl.trainers.factories",
        "agentrl.trainers.replay",
    ],
)
def test_lazy_names_still_resolve(module: str) -> None:
    import importlib

    mod = importlib.import_module(module)
    for name in [*mod.__all__, *(["HFPolicy"] if module.endswith("factories") else [])]:
        assert getattr(mod, name) is not None, name
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        _ = mod.nope
