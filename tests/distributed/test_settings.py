"""The Ray settings of `agentrl train` and the single-process path without Ray (no cluster needed)."""

import sys

import pytest

from agentrl.errors import ConfigError
from agentrl.trainers.cli import main as cli_main
from agentrl.trainers.train import TrainConfig, open_runtime
from agentrl.trainers.train_setup import DeployConfig, prepare_run


def test_ray_settings_need_ray(capsys):
    for flags in (["--rollout-workers", "2"], ["--learners", "2"], ["--weights-dir", "/tmp/w"]):
        assert cli_main(["train", "--model", "tiny", *flags]) == 2
        err = capsys.readouterr().err
        assert "only apply with --ray (local, auto or ray://host:port)" in err, err
    assert cli_main(["train", "--model", "tiny", "--ray", "local", "--learners", "0"]) == 2
    assert "--learners must be a positive integer, got 0" in capsys.readouterr().err


def test_a_resume_may_move_to_ray_but_not_change_the_experiment(tmp_path):
    _, run = prepare_run(TrainConfig(model="tiny", out=str(tmp_path / "r")))
    on_ray = DeployConfig(ray="auto", rollout_workers=4)
    moved, _ = prepare_run(TrainConfig(model="tiny", resume=str(run.path), deploy=on_ray))
    assert moved.deploy == on_ray
    with pytest.raises(ConfigError, match=r"cannot change \['group_size'\]"):
        prepare_run(TrainConfig(model="tiny", resume=str(run.path), deploy=on_ray, group_size=8))


async def test_without_ray_installed_the_error_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray now fails as if it were not installed
    cfg, run = prepare_run(
        TrainConfig(model="tiny", out=str(tmp_path / "r"), deploy=DeployConfig(ray="local"))
    )
    with pytest.raises(ConfigError, match=r"pip install 'agentrl\[ray\]' \(or run without --ray\)"):
        async with open_runtime(cfg, run):
            pass


async def test_a_bad_address_is_refused(tmp_path, monkeypatch):
    ray = pytest.importorskip("ray")
    # After the session cluster's tests in one process (-n 0), Ray is initialised and connect would use it.
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    from agentrl.trainers.ray.runtime import RayOptions, connect

    with pytest.raises(ConfigError, match="give local, auto, ray://host:port"):
        connect("nowhere", TrainConfig(), RayOptions())


def test_the_broker_and_balancer_modules_import_neither_torch_nor_transformers():
    # Each Ray actor is a fresh process that imports its class's module (and its package): the weight broker
    # and the load balancer, two of a run's five actors, took 2 CPU-s more each to start while the package
    # imported the evaluation stack (torch, transformers) at the top; now 0.35 CPU-s (tests/distributed).
    import subprocess

    code = (
        "import sys\n"
        "from agentrl.trainers.ray.actors import LoadBalancer\n"
        "from agentrl.trainers.ray.weights import WeightBroker\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
