"""TrainConfig's groups (#41): at most 15 top-level settings, every flag as before, Python code of the flat
settings still working, config.json files written before the grouping (fixtures written by commit b3b9c8e)
loading, resuming, replaying and evaluating, the device's choices kept apart (resolved.json), the one resume
merge, and the sandbox start cap as a flag."""

from __future__ import annotations

import dataclasses
import json
import pickle
import shutil
from pathlib import Path

import pytest

from agentrl.config import config_from_dict, config_to_dict
from agentrl.dynamic_sampling import DynamicSampling
from agentrl.errors import ConfigError, MigrationError
from agentrl.learner.correction import Correction
from agentrl.lora import LoraConfig
from agentrl.metrics import read_metrics
from agentrl.replay import load as load_run
from agentrl.run import RunDir
from agentrl.sandbox.pool import MAX_STARTING_ENV
from agentrl.trainers import factories
from agentrl.trainers.cli import _train_config, build_parser
from agentrl.trainers.cli import main as cli_main
from agentrl.trainers.deploy import DeployConfig, SandboxConfig
from agentrl.trainers.evaluate import EvalConfig, run_settings
from agentrl.trainers.replay.reproduce import run_correction
from agentrl.trainers.replay.weights import train_config
from agentrl.trainers.train_config import (
    RESUMABLE,
    AsyncConfig,
    BatchConfig,
    OutputConfig,
    ResolvedRun,
    SamplerConfig,
    TrainConfig,
    WeightsConfig,
    resumed_config,
)

FIXTURES = Path(__file__).parent / "fixtures"
SYNC = FIXTURES / "config_b3b9c8e_sync.json"
"""config.json of ``agentrl train --model tiny --env calculator-v0 --steps 1 --group-size 2
--groups-per-step 1 --rollout.max-new-tokens 4 --eval.tasks 1 --eval.samples 1 --no-progress`` at commit
b3b9c8e (before the
groups): written by its ``prepare_run``, tests/trainers/fixtures/README.md says how."""
GROUPED = FIXTURES / "config_b3b9c8e_grouped.json"
"""config.json at commit b3b9c8e of a config with every setting that moved into a group at a value other than
its default (the config below, ``WANT``)."""
GROUPS = ("weights", "batch", "sampler", "async_", "output")

WANT = {
    "weights": WeightsConfig(
        device="cpu", dtype="bfloat16", master_dtype="bfloat16", lora=LoraConfig(rank=4)
    ),
    "batch": BatchConfig(3, 2, DynamicSampling(max_draws=3), "difficulty"),
    "sampler": SamplerConfig("hf", "http://127.0.0.1:8000", "served"),
    "async_": AsyncConfig(2, "drop", Correction(cap=3.0)),
}
"""The groups the GROUPED fixture's settings land in (``output`` depends on where the run is)."""
FLAGS = [
    *(["--device", "cpu", "--dtype", "bfloat16", "--master-dtype", "bfloat16", "--lora.rank", "4"]),
    *(
        [
            "--group-size",
            "3",
            "--groups-per-step",
            "2",
            "--dynamic-sampling",
            "true",
            "--dynamic-sampling.max-draws",
            "3",
        ]
    ),
    *(
        [
            "--curriculum",
            "difficulty",
            "--policy",
            "hf",
            "--vllm-url",
            "http://127.0.0.1:8000",
            "--vllm-model",
            "served",
        ]
    ),
    *(
        [
            "--max-staleness",
            "2",
            "--on-stale",
            "drop",
            "--correction.cap",
            "3",
            "--steps",
            "3",
            "--checkpoint-every",
            "2",
        ]
    ),
    *(
        [
            "--keep-checkpoints",
            "4",
            "--older-checkpoints",
            "half",
            "--loggers",
            "tensorboard",
            "--no-progress",
        ]
    ),
    *(["--eval.tasks", "2", "--eval.samples", "1"]),
]
"""The flags of every moved setting, at the GROUPED fixture's values."""


def parse_train(argv: list[str]) -> TrainConfig:
    return _train_config(build_parser().parse_args(["train", *argv]))


def ungrouped(data: dict) -> dict:
    """A config dict with its groups' settings at the top level, as config.json had them before."""
    return {k: v for k, v in data.items() if k not in GROUPS} | {
        k: v for g in GROUPS for k, v in data.get(g, {}).items()
    }


def old_run(tmp_path: Path, fixture: Path, name: str = "old") -> Path:
    run = tmp_path / name
    run.mkdir()
    shutil.copy(fixture, run / "config.json")
    return run


def test_at_most_15_settings_at_the_top_and_every_flag_as_before():
    assert len(dataclasses.fields(TrainConfig)) <= 15, [f.name for f in dataclasses.fields(TrainConfig)]
    cfg = parse_train(["--model", "tiny", *FLAGS])
    for group, want in WANT.items():
        assert getattr(cfg, group) == want, group
    assert cfg.output == OutputConfig(
        steps=3,
        checkpoint_every=2,
        keep_checkpoints=4,
        older_checkpoints="half",
        loggers=("tensorboard",),
        progress=False,
        eval=EvalConfig(tasks=2, samples=1),
    )
    usage = build_parser()._subparsers._group_actions[0].choices["train"].format_usage()  # type: ignore[union-attr]
    for flag in (
        "--group-size",
        "--max-staleness",
        "--out",
        "--device",
        "--policy",
        "--sandbox.max-starting",
    ):
        assert f"[{flag} " in usage, flag
    assert not any(f"[--{g} " in usage or f"[--{g}." in usage for g in GROUPS)  # no flag of their own


def test_python_code_of_the_settings_before_the_groups_still_works():
    cfg = TrainConfig(model="tiny", group_size=3, max_staleness=1, on_stale="drop", out="r", steps=2)
    assert cfg == TrainConfig(
        model="tiny",
        batch=BatchConfig(group_size=3),
        async_=AsyncConfig(1, "drop"),
        output=OutputConfig(steps=2, out="r"),
    )
    assert (cfg.group_size, cfg.max_staleness, cfg.out, cfg.steps) == (3, 1, "r", 2)  # type: ignore[attr-defined]
    again = dataclasses.replace(cfg, group_size=5)  # type: ignore[call-arg]
    assert (
        again.batch == BatchConfig(group_size=5) and again.async_ == cfg.async_ and again.output == cfg.output
    )
    assert TrainConfig(lora=LoraConfig(rank=2), device="cpu").weights == WeightsConfig(
        "cpu", lora=LoraConfig(2)
    )  # type: ignore[call-arg]
    # Errors name the flag, however the setting was given.
    with pytest.raises(ConfigError, match=r"^--group-size must be a positive integer, got 0$"):
        TrainConfig(group_size=0)  # type: ignore[call-arg]
    with pytest.raises(ConfigError, match=r"^--group-size must be a positive integer, got 0$"):
        config_from_dict(TrainConfig, {"batch": {"group_size": 0}})
    with pytest.raises(ConfigError, match=r"^--on-stale drop needs --max-staleness >= 1$"):
        parse_train(["--on-stale", "drop"])
    with pytest.raises(
        MigrationError, match="deploy=DeployConfig"
    ):  # the deployment's migration is as before
        TrainConfig(ray="local")  # type: ignore[call-arg]
    assert pickle.loads(pickle.dumps(cfg)) == cfg  # Ray ships it to its actors


def test_a_config_json_from_before_the_groups_loads_resumes_replays_and_evaluates(tmp_path):
    flat = json.loads(GROUPED.read_text())
    assert flat["max_staleness"] == 2 and not set(GROUPS) & flat.keys()  # the fixture really is the old form
    run = old_run(tmp_path, GROUPED)
    cfg = RunDir(run).read_config(TrainConfig)
    for group, want in WANT.items():
        assert getattr(cfg, group) == want, group
    # Every setting reads as written: the groups hold exactly the old top-level settings.
    written = ungrouped(config_to_dict(cfg))
    assert written["deploy"].pop("sandbox") == {"max_starting": None}  # new since the fixture: its default
    new_reward = {k: written["reward"].pop(k) for k in ("relative_judge", "relative_weight")}
    assert new_reward == {"relative_judge": False, "relative_weight": 1.0}  # new since the fixture: defaults
    assert written["rollout"].pop("episode_timeout") == 1800.0  # new since the fixture: its default
    assert flat["rollout"].pop("tool_format") is None  # now the env's own argument (env_kwargs); none here
    assert written == flat
    # Resume: the run's settings, with what a resume may change given now; the experiment cannot change.
    resumed, rd = factories.prepare_run(
        parse_train(["--resume", str(run), "--steps", "5", "--keep-checkpoints", "2"])
    )
    assert resumed.output.steps == 5 and resumed.output.keep_checkpoints == 2
    assert resumed.output.out == resumed.output.resume == str(run)
    assert {g: getattr(resumed, g) for g in WANT} == WANT and resumed.deploy == cfg.deploy
    assert json.loads(rd.config_path.read_text())["batch"]["group_size"] == 3  # rewritten grouped
    for flags, changed in (
        (["--max-staleness", "1"], "max_staleness"),
        (["--lora.rank", "8"], "lora"),
        (["--seed", "1"], "seed"),
    ):
        with pytest.raises(ConfigError, match=rf"cannot change \['{changed}'\]"):
            factories.prepare_run(parse_train(["--resume", str(run), *flags]))
    # Replay and eval read it.
    (run / "trajectories.jsonl").write_text("")
    replayed = load_run(run)
    assert train_config(replayed) == resumed and run_correction(replayed) == Correction(cap=3.0)
    settings = run_settings(str(run))
    assert settings is not None and settings.env == "calculator-v0"
    # A run from before resolved.json: the sizes its config.json holds are the ones it resolved.
    assert ResolvedRun.read(RunDir(run), cfg) == ResolvedRun.of(cfg.learner)
    assert ResolvedRun.of(cfg.learner).micro_batch_tokens == flat["learner"]["micro_batch_tokens"]


def test_the_resume_merge_is_one_function(tmp_path):
    run = old_run(tmp_path, GROUPED)
    saved = RunDir(run).read_config(TrainConfig)
    # Python code passes a whole config: the run's, with a longer run asked for.
    asked = dataclasses.replace(saved, output=OutputConfig(steps=9, resume=str(run)))
    merged = resumed_config(asked)
    assert merged.output.steps == 9 and merged.output.out == str(run) and merged.batch == saved.batch
    assert {"output", "deploy", "steps", "older_checkpoints", "ray", "sandbox"} <= RESUMABLE
    with pytest.raises(ConfigError, match=r"cannot change \['group_size'\]"):
        resumed_config(dataclasses.replace(asked, batch=dataclasses.replace(saved.batch, group_size=4)))
    with pytest.raises(ConfigError, match=r"no config\.json there"):
        resumed_config(TrainConfig(resume=str(tmp_path / "nothing")))  # type: ignore[call-arg]


def test_a_new_run_keeps_what_its_device_chose_apart_from_its_config(tmp_path):
    cfg, run = factories.prepare_run(TrainConfig(model="tiny", env="calculator-v0", out=str(tmp_path / "r")))
    learner = json.loads(run.config_path.read_text())["learner"]
    assert (learner["micro_batch_tokens"], learner["chunk_size"], learner["attention"]) == (0, 0, "auto")
    found = factories.resolved(cfg, run)
    assert found == ResolvedRun(**json.loads(run.resolved_path.read_text()))
    assert found.micro_batch_tokens == 384 and found.chunk_size == 128 and found.attention != "auto"  # CPU
    assert found.learner(cfg.learner).micro_batch_tokens == 384
    again, _ = factories.prepare_run(parse_train(["--resume", str(run.path)]))
    assert again.output.resume == str(run.path) and dataclasses.replace(again, output=cfg.output) == cfg
    assert factories.resolved(again, run) == found


def test_sandbox_max_starting_is_a_flag_that_reaches_every_pool(monkeypatch):
    monkeypatch.delenv(MAX_STARTING_ENV, raising=False)
    cfg = parse_train(["--sandbox.max-starting", "2"])  # the default env runs its code in a sandbox
    assert cfg.deploy == DeployConfig(sandbox=SandboxConfig(max_starting=2))
    pool = factories.sandbox_pool(cfg, 3)
    assert pool is not None and pool.max_starting == 2 and factories.with_sandbox_cap(cfg) == cfg
    assert factories.sandbox_pool(parse_train(["--env", "calculator-v0"]), 3) is None  # runs no code
    # Not given: this process's $AGENTRL_SANDBOX_MAX_STARTING, which the Ray workers do not see: they get
    # it in their config.
    monkeypatch.setenv(MAX_STARTING_ENV, "3")
    default = parse_train([])
    pool = factories.sandbox_pool(default, 3)
    assert pool is not None and pool.max_starting == 3
    sent = pickle.loads(pickle.dumps(factories.with_sandbox_cap(default)))
    monkeypatch.delenv(MAX_STARTING_ENV)
    pool = factories.sandbox_pool(sent, 3)  # as a worker without the variable builds it
    assert pool is not None and pool.max_starting == 3
    with pytest.raises(ConfigError, match=r"--sandbox.max-starting must be a positive integer, got 0"):
        parse_train(["--sandbox.max-starting", "0"])


@pytest.mark.slow  # two tiny training runs, a replayed step and an evaluation
def test_a_run_from_before_the_groups_resumes_replays_and_evaluates(tmp_path, capsys):
    """A run whose config.json (and lack of resolved.json) is as b3b9c8e wrote it: its checkpoint comes from
    a run of today's trainer with the same settings (a checkpoint is not kept as a fixture)."""
    run = tmp_path / "old"
    flags = ["--model", "tiny", "--env", "calculator-v0", "--group-size", "2", "--groups-per-step", "1"]
    flags += ["--rollout.max-new-tokens", "4", "--eval.tasks", "1", "--eval.samples", "1", "--no-progress"]
    assert cli_main(["train", *flags, "--steps", "1", "--out", str(run)]) == 0
    old = json.loads(SYNC.read_text())
    assert old["group_size"] == 2 and "batch" not in old
    shutil.copy(SYNC, run / "config.json")  # it names another folder: the run was moved since
    (run / "resolved.json").unlink()
    capsys.readouterr()
    assert cli_main(["train", "--resume", str(run), "--steps", "2"]) == 0
    assert f"resumed {run} at step 1" in capsys.readouterr().out
    assert [r["step"] for r in read_metrics(run)] == [0, 1]
    saved = json.loads((run / "config.json").read_text())
    assert saved["batch"]["group_size"] == 2 and saved["output"]["steps"] == 2
    assert saved["learner"]["micro_batch_tokens"] == old["learner"]["micro_batch_tokens"]
    assert cli_main(["replay", str(run), "--step", "1"]) == 0, capsys.readouterr().out
    capsys.readouterr()
    assert cli_main(["eval", "--model", str(run), "--tasks", "1", "--k", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["env"] == "calculator-v0" and report["episodes"] == 1


def test_a_config_json_from_before_the_setting_loads_with_the_default():
    # --older-checkpoints (lean checkpoints, agentrl.checkpoint) is a TrainConfig setting.
    old = config_to_dict(TrainConfig())
    del old["output"]["older_checkpoints"]  # what runs before lean checkpoints recorded
    assert config_from_dict(TrainConfig, old).output.older_checkpoints == "exact"
    assert "older_checkpoints" in RESUMABLE  # a resumed run may change it: it is not part of the experiment
