"""The trainer starts a sandbox pool only for envs whose tools run code, so a machine where the sandbox
cannot start still trains the others (seen on a GPU machine whose process limit does not trip)."""

from agentrl.errors import SandboxError
from agentrl.trainers.cli import main as cli_main
from agentrl.trainers.train import TrainConfig
from agentrl.trainers.train_setup import needs_sandbox

FAST = ["--model", "tiny", "--group-size", "2", "--groups-per-step", "1", "--rollout.max-new-tokens", "16"]
FAST += ["--steps", "1", "--eval.tasks", "1", "--no-progress"]


def test_only_envs_whose_tools_run_code_need_a_sandbox():
    assert needs_sandbox(TrainConfig(model="tiny", env="math-tir-arith-v0"))
    assert needs_sandbox(TrainConfig(model="tiny", env="code-tests-v0"))
    assert not needs_sandbox(TrainConfig(model="tiny", env="calculator-v0"))  # a tool env, in-process tool
    assert not needs_sandbox(TrainConfig(model="tiny", env="guess-number-v0"))  # no tools at all


def test_without_a_working_sandbox_the_calculator_trains_and_the_tir_task_refuses(
    tmp_path, monkeypatch, capsys
):
    from agentrl.sandbox import SandboxPool

    async def broken(self):
        raise SandboxError("the sandbox self-test failed (simulated)")

    monkeypatch.setattr(SandboxPool, "start", broken)
    assert cli_main(["train", *FAST, "--env", "calculator-v0", "--out", str(tmp_path / "calc")]) == 0
    capsys.readouterr()
    assert cli_main(["train", *FAST, "--env", "math-tir-arith-v0", "--out", str(tmp_path / "tir")]) == 2
    assert "agentrl train: error: the sandbox self-test failed (simulated)" in capsys.readouterr().err
