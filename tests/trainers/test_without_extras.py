"""The README's first command installs no optional extra: `agentrl train` must run without any of them.

`.ci/setup` (no `--dev`) installs `agentrl[smollm,plot]` only, while the test venv holds every extra, so a
stray top-level `import ray` (or peft, mcp, ...) in the default path would pass every other test and break
a user's first command on a fresh machine. Here the extras' packages are made unimportable in a subprocess
and one tiny step is trained through the real CLI entry point.
"""

import subprocess
import sys

import pytest

# Top-level modules of the optional extras and of the dev-only packages (pyproject.toml).
EXTRAS = (
    "ray",
    "peft",
    "mcp",
    "docker",
    "e2b_code_interpreter",
    "agents",
    "anthropic",
    "bfcl_eval",
    "reasoning_gym",
    "textarena",
    "vllm",
)

BLOCKED_RUN = f"""
import importlib.abc, runpy, sys
BLOCKED = {EXTRAS!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: not installed by .ci/setup)")
        return None
sys.meta_path.insert(0, Block())
sys.argv = ["agentrl", *sys.argv[1:]]
runpy.run_module("agentrl.trainers", run_name="__main__")
"""


@pytest.mark.slow  # one tiny training step in a fresh interpreter: ~20 s on 2 cores
def test_default_train_runs_without_any_optional_extra(tmp_path):
    args = ["train", "--model", "tiny", "--steps", "1", "--group-size", "2", "--groups-per-step", "2"]
    args += ["--rollout.max-new-tokens", "16", "--eval.tasks", "0", "--no-progress"]
    args += ["--out", str(tmp_path / "r")]
    out = subprocess.run(
        [sys.executable, "-c", BLOCKED_RUN, *args], capture_output=True, text=True, timeout=600, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "step 0:" in out.stdout
    assert (tmp_path / "r" / "metrics.jsonl").exists()


def test_the_blocker_blocks():
    # The test above is only meaningful if a blocked import really fails in that interpreter.
    probe = BLOCKED_RUN.split("sys.argv")[0] + "import ray\n"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode != 0 and "blocked: not installed by .ci/setup" in out.stderr
