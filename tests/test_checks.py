"""Static checks that run with the suite, so CI (``.ci/run``, the README's test command) enforces them:
ruff with the docstring rules, mypy strict, the 600-line budget per source file, warnings as errors.

Each checker is also run on a planted violation: a checker that stopped looking fails too. The import
layers and the no-cycle rule are in ``test_packaging.py``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
MAX_LINES = 600
SOURCE_FOLDERS = ("agentrl", "trainers", "envs", "tools", "sandbox", "benchmarks", "experiments", "examples")
"""Folders whose ``.py`` files count against the line budget (tests do not)."""


def plugin_folders() -> dict[str, str]:
    """``{import name: folder}`` for folders installed under another name (``agentrl.tools``: ``tools``)."""
    mapping = tomllib.loads(PYPROJECT.read_text())["tool"]["setuptools"]["package-dir"]
    return {name: folder for name, folder in mapping.items() if name != folder}


# --- the line budget ----------------------------------------------------------------------------------
def over_budget(files: list[Path], root: Path = ROOT) -> list[str]:
    """One line of advice per file longer than :data:`MAX_LINES`."""
    bad = []
    for path in sorted(files):
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            bad.append(
                f"{path.relative_to(root)}: {n} lines; split it along a seam into modules of at most "
                f"{MAX_LINES} lines"
            )
    return bad


def test_every_source_file_fits_the_line_budget() -> None:
    files = [
        p for folder in SOURCE_FOLDERS if (ROOT / folder).is_dir() for p in (ROOT / folder).rglob("*.py")
    ]
    assert len(files) > 50, f"found only {len(files)} source files under {ROOT}"
    bad = over_budget(files)
    assert not bad, "source files over the line budget:\n" + "\n".join(bad)


def test_line_budget_catches_a_long_file(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert over_budget(list(tmp_path.glob("*.py")), tmp_path) == [
        f"long.py: {MAX_LINES + 1} lines; split it along a seam into modules of at most {MAX_LINES} lines"
    ]


# --- ruff -----------------------------------------------------------------------------------------------
def run_ruff(*args: str) -> subprocess.CompletedProcess[str]:
    """The venv's ruff (the one the dev extra installs) on ``args``, from the repository root."""
    exe = Path(sys.executable).with_name("ruff")
    if not exe.exists():
        found = shutil.which("ruff")
        if found is None:
            pytest.fail("ruff is not installed: install the dev extra (bash .ci/setup --dev)")
        exe = Path(found)
    return subprocess.run([str(exe), *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_ruff_is_clean() -> None:
    out = run_ruff("check", "--output-format", "concise", ".")
    assert out.returncode == 0, (
        "ruff check found problems. Fix each one (`.venv/bin/ruff check --fix .` fixes some); the docstring "
        "rules (D, google convention) require a docstring on every public module, class, function and "
        "method, see [tool.ruff.lint] in pyproject.toml:\n" + out.stdout + out.stderr
    )


def test_ruff_flags_missing_docstrings(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text("def double(x: int) -> int:\n    return 2 * x\n")
    out = run_ruff(
        "check", "--config", str(PYPROJECT), "--no-cache", "--output-format", "concise", str(planted)
    )
    assert out.returncode == 1, out.stdout + out.stderr
    assert "D100" in out.stdout and "D103" in out.stdout, out.stdout


# --- mypy -----------------------------------------------------------------------------------------------
def mypy_tree(dest: Path) -> Path:
    """A tree of links that lays the repository out as it installs: ``agentrl/`` with the plug-in folders
    inside it (``agentrl/tools`` -> ``tools/``). mypy cannot follow setuptools' editable-install finder, so
    without this it would see ``agentrl.tools`` as a missing module and type everything from it as Any."""
    pkg = dest / "agentrl"
    if dest.exists():
        shutil.rmtree(dest)  # rebuilt each time: modules come and go
    pkg.mkdir(parents=True)
    for entry in (ROOT / "agentrl").iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    for name, folder in plugin_folders().items():
        (pkg / name.removeprefix("agentrl.")).symlink_to(ROOT / folder)
    return pkg


def run_mypy(target: Path, cache_dir: Path) -> subprocess.CompletedProcess[str]:
    """mypy with the repository's configuration (strict) on ``target``, keeping its cache in ``cache_dir``."""
    cmd = [sys.executable, "-m", "mypy", "--config-file", str(PYPROJECT), "--cache-dir", str(cache_dir)]
    return subprocess.run([*cmd, str(target)], cwd=ROOT, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.timeout(900)  # a cold mypy cache over the whole package, as run_mypy's own limit allows
def test_mypy_strict_is_clean() -> None:
    tree = mypy_tree(ROOT / ".mypy_cache" / "agentrl-tree")
    out = run_mypy(tree.relative_to(ROOT), ROOT / ".mypy_cache" / "agentrl-tree-cache")
    report = out.stdout + out.stderr
    # Name the files as they are in the repository, not as they are linked.
    prefix = f"{tree.relative_to(ROOT)}/"
    for name, folder in plugin_folders().items():
        report = report.replace(prefix + name.removeprefix("agentrl.") + "/", folder + "/")
    report = report.replace(prefix, "agentrl/")
    assert out.returncode == 0, (
        "mypy --strict found problems (every function fully annotated, no Any leaking into typed code; "
        "see [tool.mypy] in pyproject.toml). Run this test again to check a fix:\n" + report
    )


@pytest.mark.slow
def test_mypy_flags_unannotated_and_wrong_code(tmp_path: Path) -> None:
    planted = tmp_path / "planted.py"
    planted.write_text('def double(x):\n    return 2 * x\n\n\ndef name() -> int:\n    return "agentrl"\n')
    out = run_mypy(planted, ROOT / ".mypy_cache" / "planted-cache")
    assert out.returncode == 1, out.stdout + out.stderr
    assert "[no-untyped-def]" in out.stdout and "[return-value]" in out.stdout, out.stdout


# --- warnings -------------------------------------------------------------------------------------------
def test_warnings_are_errors() -> None:
    with pytest.raises(UserWarning, match="planted"):
        warnings.warn("planted", UserWarning, stacklevel=1)


def test_ignored_warnings_are_narrow() -> None:
    """Every ``ignore`` entry names the warning's message or the module that raises it, never a whole
    category: a new warning from our own code must fail the suite."""
    filters = tomllib.loads(PYPROJECT.read_text())["tool"]["pytest"]["ini_options"]["filterwarnings"]
    assert filters[0] == "error", f"the first filter must be 'error', got {filters[0]!r}"
    broad = []
    for f in filters[1:]:
        action, message, _category, module, *_ = [*f.split(":"), "", "", "", ""]
        if action == "ignore" and not (message.strip() or module.strip()):
            broad.append(f)
        if module.strip().startswith("agentrl"):
            broad.append(f)
    assert not broad, f"narrow these to a message or a third-party module: {broad}"
