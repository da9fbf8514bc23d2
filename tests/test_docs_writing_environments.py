"""docs/writing-environments.md runs as written: its file blocks are written to an empty folder, its Python
blocks run there in order, and its shell blocks run command by command (the tutorial's env is checked,
trained for a step with the tiny model, replayed with re-execution and evaluated, from the CLI only)."""

import json
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

DOC = (Path(__file__).resolve().parents[1] / "docs" / "writing-environments.md").read_text()
BLOCK = re.compile(r"(?:<!-- file: (?P<file>\S+) -->\n)?^```(?P<lang>\w+)\n(?P<code>.*?)^```$", re.S | re.M)
BLOCKS = [(m["lang"], m["file"], m["code"]) for m in BLOCK.finditer(DOC)]
AGENTRL = [sys.executable, "-m", "agentrl.trainers"]


def _files(folder: Path) -> None:
    for lang, name, code in BLOCKS:
        if name is not None:
            assert lang == "python"
            (folder / name).write_text(code)


def test_the_tutorial_has_the_blocks_it_promises():
    langs = [lang for lang, _, _ in BLOCKS]
    assert langs.count("bash") == 3 and langs.count("python") == 7 and langs.count("toml") == 1
    (toml,) = [code for lang, _, code in BLOCKS if lang == "toml"]
    (group,) = tomllib.loads(toml)["project"]["entry-points"].values()
    assert group == {"my_envs": "my_package.envs"}
    assert (
        "[Writing your own environment](docs/writing-environments.md)"
        in (Path(__file__).resolve().parents[1] / "README.md").read_text()
    )


@pytest.mark.usefixtures("local_sandbox_cls")
def test_python_blocks_run_in_order(tmp_path, monkeypatch, capsys):
    _files(tmp_path)
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "__tutorial__"}
    for lang, name, code in BLOCKS:
        if lang == "python" and name is None:
            exec(compile(code, "docs/writing-environments.md", "exec"), namespace)
    out = capsys.readouterr().out
    assert "1.0 terminated" in out
    assert "turn_tokens 0.0" in out and "Raise --rollout.max-new-tokens (now 16)" in out
    assert "1.0 [('remember', <ToolStatus.OK: 'ok'>, \"noted 'w'\"), ('recall'" in out


@pytest.mark.slow
@pytest.mark.usefixtures("local_sandbox_cls")
def test_shell_blocks_check_train_replay_and_eval_from_the_cli(tmp_path):
    _files(tmp_path)
    ran = []
    for lang, _, code in BLOCKS:
        if lang != "bash":
            continue
        for line in code.splitlines():
            if not line.strip() or line.startswith("#"):
                continue
            argv = shlex.split(line)
            assert argv[0] == "agentrl", line
            out = subprocess.run(
                [*AGENTRL, *argv[1:]], cwd=tmp_path, capture_output=True, text=True, timeout=900
            )
            assert out.returncode == 0, f"{line}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
            ran.append((argv[1], out.stdout))
    assert [cmd for cmd, _ in ran] == ["check", "train", "replay", "replay", "eval", "check"]
    assert "NotesEnv: agentrl check_env passed" in ran[5][1]
    assert "Gymnasium check_env passed" in ran[0][1]
    cfg = json.loads((tmp_path / "runs" / "wordsort" / "config.json").read_text())
    assert cfg["env"] == f"{(tmp_path / 'my_env.py').resolve()}:WordSortEnv"
    reexec = ran[3][1]
    assert reexec.count("trajectory ") >= 4 and "DIFFERENT" not in reexec, reexec
