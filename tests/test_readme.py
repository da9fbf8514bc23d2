"""The README's examples run as written (the slow SmolLM2 collection example is run by the rollout tests)."""

import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def block(containing: str) -> str:
    (found,) = [b for b in BLOCKS if containing in b]
    return found


def test_the_two_commands_open_the_readme():
    first = re.search(r"```bash\n(.*?)```", README, flags=re.S).group(1)
    commands = [line for line in first.splitlines() if line and not line.startswith("#")]
    assert commands == [
        "bash .ci/setup && .venv/bin/agentrl train",
        "bash .ci/setup --dev && .venv/bin/python -m pytest -q -n auto",
    ]
    # CI runs the same setup and the same pytest command, split in two tiers that together are the whole
    # suite (test_ci_runs_the_fast_tier_first_then_exactly_the_rest).
    ci = (Path(__file__).resolve().parents[1] / ".ci" / "run").read_text()
    setup, pytest_cmd = commands[1].split(" && ")
    assert f"\n{setup}\n" in ci and f"{pytest_cmd} " in ci


def test_environment_example_runs():
    code = block('agentrl.register("echo-v0", Echo)').replace('"echo-v0"', '"readme-echo-v0"')
    code = code.replace('"agentrl/echo-v0"', '"agentrl/readme-echo-v0"')
    exec(compile(code, "README.md", "exec"), {})


async def test_tool_example_runs():
    ns: dict = {}
    exec(compile(block("@tool"), "README.md", "exec"), ns)
    from agentrl import ToolContext

    out = await ns["lookup_price"]({"item": "apple"}, ToolContext())
    assert out.content == "0.50" and out.status == "ok"
    bad = await ns["lookup_price"]({"itemz": "apple"}, ToolContext())
    assert bad.status == "bad_arguments"


@pytest.mark.slow
def test_collection_example_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = block("collect(")
    for big, small in [("n_groups=2", "n_groups=1"), ("group_size=4", "group_size=2"), ("=96", "=48")]:
        assert big in code
        code = code.replace(big, small)
    exec(compile(code, "README.md", "exec"), {})
    from agentrl import read_trajectories

    trajs = list(read_trajectories(tmp_path / "rollouts.jsonl"))
    assert len(trajs) == 2 and all(t.meta.env_id == "math-tir-arith-v0" for t in trajs)


def test_the_pieces_match_the_tree():
    """The layout block under "The pieces" names every module and package of agentrl/ and every top-level
    folder, and nothing that is not there."""
    root = Path(__file__).resolve().parents[1]
    section = README.split("## The pieces\n", 1)[1]
    layout = re.search(r"```\n(.*?)```", section, flags=re.S).group(1)
    listed_core, listed_top, top = set(), set(), None
    for line in layout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not line.startswith(" ") and name.endswith("/"):
            top = name.rstrip("/")
            listed_top.add(top)
        elif top == "agentrl" and line.startswith("  ") and not line.startswith("   "):
            listed_core.add(name.rstrip("/").removesuffix(".py"))
    on_disk = {p.stem for p in (root / "agentrl").glob("*.py") if p.stem not in ("__init__", "_sync")}
    on_disk |= {p.parent.name for p in (root / "agentrl").glob("*/__init__.py")}
    assert listed_core == on_disk, f"README pieces vs agentrl/: {sorted(listed_core ^ on_disk)}"
    folders = {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}
    folders = {f for f in folders if any((root / f).rglob("*.py")) or f == "docs"} - {"build", "runs"}
    folders -= {f for f in folders if f.endswith(".egg-info")}
    assert listed_top == folders, f"README pieces vs top-level folders: {sorted(listed_top ^ folders)}"


def test_the_pieces_name_every_trainers_module():
    """Under trainers/ the layout block names every module and subpackage of the folder, and nothing else."""
    root = Path(__file__).resolve().parents[1]
    layout = re.search(r"```\n(.*?)```", README.split("## The pieces\n", 1)[1], flags=re.S).group(1)
    listed, top = set(), None
    for line in layout.splitlines():
        name = line.split()[0] if line.strip() else ""
        if not line.startswith(" ") and name.endswith("/"):
            top = name.rstrip("/")
        elif top == "trainers" and line.startswith("  ") and not line.startswith("   "):
            listed.add(name.rstrip("/").removesuffix(".py"))
    on_disk = {p.stem for p in (root / "trainers").glob("*.py") if p.stem not in ("__init__", "__main__")}
    on_disk |= {p.parent.name for p in (root / "trainers").glob("*/__init__.py")}
    assert listed == on_disk, f"README pieces vs trainers/: {sorted(listed ^ on_disk)}"


def test_the_pieces_name_every_docs_page():
    root = Path(__file__).resolve().parents[1]
    layout = re.search(r"```\n(.*?)```", README.split("## The pieces\n", 1)[1], flags=re.S).group(1)
    docs_entry = layout.split("\ndocs/", 1)[1].split("\ntests/", 1)[0]
    listed = set(re.findall(r"([\w-]+\.md)", docs_entry))
    on_disk = {p.name for p in (root / "docs").glob("*.md")}
    assert listed == on_disk, f"README pieces vs docs/*.md: {sorted(listed ^ on_disk)}"


def test_the_fast_tier_is_the_documented_one():
    """.ci/fast runs the marker expression the README gives, and every marker in it is registered."""
    import tomllib

    root = Path(__file__).resolve().parents[1]
    fast = (root / ".ci" / "fast").read_text()
    expr = re.search(r'-m "([^"]+)"', fast).group(1)
    # The README's pytest command (in parallel workers, -n auto) with the fast tier's expression.
    assert f'.venv/bin/python -m pytest -q -n auto -m "{expr}" "$@"' in fast
    assert f'-m "{expr}"' in README.split("## Testing\n", 1)[1]
    ini = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {m.split(":", 1)[0] for m in ini["markers"]}
    assert set(re.findall(r"not (\w+)", expr)) == {"slow", "ray", "gpu", "vllm"} <= registered


def test_ci_runs_the_fast_tier_first_then_exactly_the_rest():
    """.ci/run is the whole suite in three tiers: .ci/fast's expression, failing fast, then the rest of its
    complement, then the experiment-scale runs; together exactly the whole suite."""
    root = Path(__file__).resolve().parents[1]
    fast = re.search(r'-m "([^"]+)"', (root / ".ci" / "fast").read_text()).group(1)
    run = (root / ".ci" / "run").read_text()
    assert f'FAST="{fast}"' in run
    tiers = re.findall(r"^(?:\w+=\S+ )?tier (\w+) (.*?)(?: \|\| failed=1)?$", run, flags=re.M)
    assert tiers == [
        ("fast", '-x -m "$FAST" "$@"'),
        ("rest", '-m "not ($FAST) and not experiment" "$@" "${later[@]}"'),
        ("experiment", '-m "not ($FAST) and experiment" "$@" "${later[@]}"'),
    ]
    # The later tiers collect only the modules the fast tier left tests out of (tests/test_parallel.py).
    assert "AGENTRL_LATER_TIERS=$LATER tier fast" in run
