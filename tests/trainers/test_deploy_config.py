"""TrainConfig.deploy: where a run runs, nested apart from the experiment. The flags keep their names, a
config.json of an earlier release (these settings at its top level) still loads for resume, replay and eval,
and Python code written against the flat fields gets a migration message. No Ray cluster is needed."""

import dataclasses
import json
import pickle
import shutil
from pathlib import Path

import pytest

from agentrl.config import config_from_dict, config_to_dict
from agentrl.errors import ConfigError, MigrationError
from agentrl.replay import load as load_run
from agentrl.run import RunDir
from agentrl.trainers.cli import _train_config, build_parser
from agentrl.trainers.deploy import DeployConfig
from agentrl.trainers.evaluate import run_settings
from agentrl.trainers.replay.weights import train_config
from agentrl.trainers.train_setup import TrainConfig, prepare_run

FIXTURE = Path(__file__).parent / "fixtures" / "config_flat_deploy.json"
"""config.json as the trainer wrote it before the deployment settings were nested (written by
``prepare_run(TrainConfig(model="tiny", ray="local", rollout_workers=2, inference_servers=2, learners=2,
weights_dir="/mnt/shared/w", steps=2, group_size=2, groups_per_step=2))`` at commit 3f02448)."""
OLD_DEPLOY = DeployConfig(
    ray="local", rollout_workers=2, inference_servers=2, learners=2, weights_dir="/mnt/shared/w"
)
FLAGS = {
    "ray": ["--ray"],
    "rollout_workers": ["--rollout-workers", "--rollout_workers"],
    "inference_servers": ["--inference-servers", "--inference_servers"],
    "learners": ["--learners"],
    "weights_dir": ["--weights-dir", "--weights_dir"],
}


def ungrouped(data: dict) -> dict:
    """A config dict with the settings of TrainConfig's groups other than deploy (weights, batch, ...) at the
    top level, where they were when the fixture was written."""
    groups = ("weights", "batch", "sampler", "async_", "output")
    return {k: v for k, v in data.items() if k not in groups} | {
        k: v for g in groups for k, v in data.get(g, {}).items()
    }


def old_run(tmp_path: Path) -> Path:
    run = tmp_path / "old"
    run.mkdir()
    shutil.copy(FIXTURE, run / "config.json")
    return run


def parse_train(argv: list[str]) -> TrainConfig:
    return _train_config(build_parser().parse_args(["train", *argv]))


def test_every_deployment_flag_keeps_its_spellings_and_sets_deploy():
    assert TrainConfig().deploy == DeployConfig()  # default: this process
    values = {"ray": "auto", "rollout_workers": 3, "inference_servers": 2, "learners": 4, "weights_dir": "/w"}
    for i in range(2):  # the dashed spellings, then the underscored ones
        argv = [a for n, v in values.items() for a in (FLAGS[n][min(i, len(FLAGS[n]) - 1)], str(v))]
        assert parse_train(argv).deploy == DeployConfig(**values), argv  # type: ignore[arg-type]
    with pytest.raises(SystemExit):  # one spelling per setting, as before: no --deploy.*
        build_parser().parse_args(["train", "--deploy.ray", "local"])
    with pytest.raises(ConfigError, match="--learners must be a positive integer, got 0"):
        parse_train(["--ray", "local", "--learners", "0"])
    with pytest.raises(ConfigError, match=r"--rollout-workers, --weights-dir only apply with --ray"):
        parse_train(["--rollout-workers", "2", "--weights-dir", "/w"])


def test_config_json_is_nested_now(tmp_path):
    cfg, run = prepare_run(TrainConfig(model="tiny", out=str(tmp_path / "r"), deploy=OLD_DEPLOY))
    data = json.loads(run.config_path.read_text())
    assert data["deploy"] == dataclasses.asdict(OLD_DEPLOY)
    assert not {f.name for f in dataclasses.fields(DeployConfig)} & data.keys()
    assert run.read_config(TrainConfig) == cfg


def test_an_old_flat_config_json_loads_with_its_deployment_lifted(tmp_path):
    flat = json.loads(FIXTURE.read_text())
    assert flat["ray"] == "local" and "deploy" not in flat  # the fixture really is the old form
    cfg = RunDir(old_run(tmp_path)).read_config(TrainConfig)
    assert cfg.deploy == OLD_DEPLOY
    # Every other setting reads as written: the nested form of the same settings gives the same config.
    nested = {k: v for k, v in flat.items() if k not in dataclasses.asdict(OLD_DEPLOY)}
    assert config_from_dict(TrainConfig, {**nested, "deploy": dataclasses.asdict(OLD_DEPLOY)}) == cfg
    written = ungrouped(config_to_dict(cfg))
    assert nested["rollout"].pop("tool_format") is None  # now the env's own argument (env_kwargs); none here
    newer = written.keys() - nested.keys() - {"deploy"}  # settings added since the fixture: their defaults
    defaults = ungrouped(config_to_dict(TrainConfig()))
    assert {k: written[k] for k in newer} == {k: defaults[k] for k in newer}
    assert written["rollout"].pop("episode_timeout") == 1800.0  # new since the fixture: its default
    assert {k: v for k, v in written.items() if k not in newer} == {
        **nested,
        "deploy": dataclasses.asdict(OLD_DEPLOY),
    }
    with pytest.raises(ConfigError, match=r"\['ray'\] given both at the top level"):
        config_from_dict(TrainConfig, {**flat, "deploy": {"ray": "auto"}})


def test_an_old_run_resumes_and_may_move_its_deployment(tmp_path):
    run = old_run(tmp_path)
    # `agentrl train --resume RUN --ray auto --rollout-workers 4`: the run's settings, a new deployment.
    cfg = parse_train(["--resume", str(run), "--ray", "auto", "--rollout-workers", "4"])
    assert cfg.deploy == dataclasses.replace(OLD_DEPLOY, ray="auto", rollout_workers=4)
    resumed, rd = prepare_run(cfg)
    assert resumed.deploy == cfg.deploy and resumed.group_size == 2 and resumed.out == str(run)
    assert json.loads(rd.config_path.read_text())["deploy"]["rollout_workers"] == 4  # rewritten nested
    # A resume without flags keeps the old run's deployment; the experiment still cannot change.
    assert parse_train(["--resume", str(tmp_path / "old")]).deploy == resumed.deploy
    with pytest.raises(ConfigError, match=r"cannot change \['group_size'\]"):
        prepare_run(parse_train(["--resume", str(run), "--group-size", "4"]))


def test_replay_and_eval_read_an_old_run(tmp_path):
    run = old_run(tmp_path)
    (run / "trajectories.jsonl").write_text("")
    assert train_config(load_run(run)).deploy == OLD_DEPLOY
    settings = run_settings(str(run))
    assert settings is not None and settings.env == "math-tir-arith-v0" and settings.max_turns == 3


def test_python_code_of_the_flat_fields_gets_the_migration():
    for name in FLAGS:
        with pytest.raises(MigrationError, match=rf"the {name}= argument was removed.*deploy=DeployConfig"):
            TrainConfig(**{name: None})
        with pytest.raises(TypeError):  # what `except TypeError` caught before still catches it
            dataclasses.replace(TrainConfig(), **{name: None})
        with pytest.raises(AttributeError, match=rf"TrainConfig\.{name} moved: read cfg\.deploy\.{name}"):
            getattr(TrainConfig(), name)
    with pytest.raises(AttributeError, match=r"^'TrainConfig' object has no attribute 'nope'$"):
        TrainConfig().nope  # type: ignore[attr-defined]  # noqa: B018
    changelog = (Path(__file__).resolve().parents[2] / "CHANGELOG.md").read_text()
    entry = changelog.split("- **`TrainConfig.deploy`**", 1)[1].split("\n- ", 1)[0]
    assert "*Migration:*" in entry and "deploy=DeployConfig(ray=" in entry
    # Ray ships the config to its actors: it pickles, and compares equal after.
    cfg = TrainConfig(model="tiny", deploy=OLD_DEPLOY)
    assert pickle.loads(pickle.dumps(cfg)) == cfg


def test_the_weights_dir_picks_the_shared_disk_transport(tmp_path):
    from agentrl.trainers.ray.runtime import RayOptions, RayRuntime

    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    # The runtime picks its transport when built, before it touches Ray (so no cluster is needed here).
    for weights_dir, transport in ((str(tmp_path / "w"), "shared_disk"), (None, "object_store")):
        cfg = TrainConfig(model="tiny", deploy=DeployConfig(ray="local", weights_dir=weights_dir))
        rt = RayRuntime(None, cfg, run, RayOptions())
        rt.ledger.close()
        assert rt.transport.name == transport
        assert getattr(rt.transport, "folder", None) == (tmp_path / "w" if weights_dir else None)
    with pytest.raises(
        MigrationError, match=r"RayOptions: the weights_dir= argument was removed.*--weights-dir"
    ):
        RayOptions(weights_dir="/w")  # type: ignore[call-arg]
