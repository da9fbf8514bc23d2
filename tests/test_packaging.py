"""Packaging: the wheel claims only the `agentrl` import name; imports point one way; public API pinned."""

import ast
import os
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

import agentrl

ROOT = Path(__file__).resolve().parents[1]
LAYERS = {
    "agentrl": "agentrl",
    "tools": "agentrl.tools",
    "sandbox": "agentrl.sandbox",
    "envs": "agentrl.envs",
    "trainers": "agentrl.trainers",
}
# What each folder must never import (trainers -> envs -> tools/sandbox -> agentrl core).
FORBIDDEN = {
    "agentrl": ("agentrl.envs", "agentrl.tools", "agentrl.sandbox", "agentrl.trainers"),
    "tools": ("agentrl.envs", "agentrl.sandbox", "agentrl.trainers"),
    "sandbox": ("agentrl.envs", "agentrl.tools", "agentrl.trainers"),
    "envs": ("agentrl.trainers",),
    "trainers": (),
}


def _imports(path: Path, package: str) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                rel = path.relative_to(ROOT).parent.parts[1:]
                base = package.split(".") + list(rel)
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            found.append((node.lineno, mod))
            found += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
    return found


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_imports_point_one_way(folder):
    bad = []
    for path in (ROOT / folder).rglob("*.py"):
        for lineno, mod in _imports(path, LAYERS[folder]):
            for forbidden in FORBIDDEN[folder]:
                top = forbidden.split(".")[1]
                if mod in (forbidden, top) or mod.startswith((forbidden + ".", top + ".")):
                    bad.append(f"{path.relative_to(ROOT)}:{lineno} imports {mod}")
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_every_package_folder_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    on_disk = set()
    for folder, name in LAYERS.items():
        for init in (ROOT / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / folder).parts
            on_disk.add(".".join([name, *rel]))
    assert on_disk == listed, f"add to/remove from [tool.setuptools] packages: {on_disk ^ listed}"


def test_public_api_is_pinned():
    public = sorted(n for n in dir(agentrl) if not n.startswith("_"))
    assert sorted(agentrl.__all__) == sorted(set(agentrl.__all__))
    missing = [n for n in agentrl.__all__ if not hasattr(agentrl, n)]
    assert not missing
    modules = {
        "checker",
        "env",
        "errors",
        "execution",
        "protocols",
        "registry",
        "store",
        "types",
        "testing",
    }
    extra = set(public) - set(agentrl.__all__) - modules - {"envs", "tools", "sandbox", "trainers"}
    # submodules imported lazily by users (credit, learner, ...) may appear; no other names may leak
    assert all(
        hasattr(getattr(agentrl, n), "__path__") or hasattr(getattr(agentrl, n), "__file__") for n in extra
    ), f"non-module names leak from agentrl: {extra}"


@pytest.mark.slow
def test_wheel_installs_in_a_clean_venv_and_claims_only_agentrl(tmp_path):
    wheel_dir = tmp_path / "wheel"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(ROOT),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(wheel_dir),
        ],
        check=True,
        capture_output=True,
    )
    (wheel,) = wheel_dir.glob("agentrl-*.whl")
    tops = {n.split("/")[0] for n in zipfile.ZipFile(wheel).namelist()}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"agentrl"}

    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    py = env_dir / "bin" / "python"
    site = subprocess.check_output(
        [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
    ).strip()
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)  # a wheel install is an unzip plus metadata; pip is not needed for that
    # Dependencies (torch, transformers, ...) come from this interpreter's site-packages, appended
    # after the clean venv's own so the wheel's agentrl wins; .pth files there are not processed,
    # so the editable install of the checkout stays invisible.
    deps = sysconfig.get_paths()["purelib"]
    Path(site, "zz_deps.pth").write_text(deps + "\n")
    code = (
        "import agentrl, agentrl.envs, agentrl.tools, agentrl.sandbox, agentrl.trainers, importlib.util\n"
        "for m in (agentrl, agentrl.envs, agentrl.tools, agentrl.sandbox, agentrl.trainers):\n"
        f"    assert m.__file__.startswith({site!r}), m.__file__\n"
        "for top in ('envs', 'tools', 'sandbox', 'trainers'):\n"
        "    assert importlib.util.find_spec(top) is None, top\n"
        "assert 'guess-number-v0' in agentrl.list_envs()\n"
        "print('ok')\n"
    )
    out = subprocess.run(
        [py, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-3000:]
