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


# Layers inside the core, bottom first. A module may import modules of its own layer and of the layers below,
# never above; a package (credit, learner, policies, replay) is one unit. docs/architecture.md draws them.
CORE_LAYERS: tuple[tuple[str, frozenset[str]], ...] = (
    (
        "foundation",
        frozenset({"errors", "_sync", "config", "weights", "tokenizer_id", "loading", "heap", "_lazy"}),
    ),
    (
        "data",
        frozenset({"types", "tool_records", "reward_records", "provenance", "execution", "run", "groups"}),
    ),
    ("contracts", frozenset({"protocols", "env", "registry", "checker"})),
    ("tokens", frozenset({"masking", "chat", "audit"})),
    ("records", frozenset({"store", "metrics", "metric_names", "scores", "staleness", "dynamic_sampling"})),
    ("replay", frozenset({"replay"})),
    (
        "acting",
        frozenset(
            {
                "models",
                "precision",
                "lora",
                "lora_sync",
                "checkpoint",
                "policies",
                "episode",
                "samples",
                "rollout",
                "testing",
                "rewards",
            }
        ),
    ),
    ("learning", frozenset({"batch", "credit", "learner"})),
    ("update", frozenset({"update"})),
)
"""``agentrl/__init__.py`` (the public API) sits above them all; nothing in the core imports it."""


def module_name(path: Path, folder: Path, package: str) -> str:
    """The import name of ``path`` inside ``folder``, which installs as ``package``."""
    parts = list(path.relative_to(folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _imports(
    path: Path, module: str, known: set[str] | frozenset[str] = frozenset()
) -> list[tuple[int, str]]:
    """``(line, imported name)`` for every import in ``path`` (inside functions and ``TYPE_CHECKING`` too).

    ``from a import b`` yields ``a.b`` when that is one of the ``known`` modules, else ``a``.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the file's package
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join([*base, node.module] if node.module else base)
            else:
                mod = node.module or ""
            subs = [f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in known]
            if len(subs) < len(node.names):
                found.append((node.lineno, mod))
            found += [(node.lineno, s) for s in subs]
    return found


def import_graph(
    root: Path = ROOT, folders: dict[str, str] = LAYERS
) -> dict[str, dict[str, tuple[Path, int]]]:
    """``{module: {imported module: (file, line)}}`` over the repository's own modules."""
    files = {}
    for folder, package in folders.items():
        for path in sorted((root / folder).rglob("*.py")):
            files[module_name(path, root / folder, package)] = path
    graph: dict[str, dict[str, tuple[Path, int]]] = {}
    for mod, path in files.items():
        edges = graph.setdefault(mod, {})
        for lineno, name in _imports(path, mod, set(files)):
            while name and name not in files:  # `import agentrl.credit.otb` names a module; keep the longest
                name = name.rpartition(".")[0]
            if name and name != mod:
                edges.setdefault(name, (path, lineno))
    return graph


def layer_violations(graph: dict[str, dict[str, tuple[Path, int]]], root: Path = ROOT) -> list[str]:
    """One line per import against :data:`CORE_LAYERS` (or per core module without a layer)."""
    rank = {unit: i for i, (_, units) in enumerate(CORE_LAYERS) for unit in units}
    names = [name for name, _ in CORE_LAYERS]
    core = {
        m
        for m in graph
        if m.startswith("agentrl.") and m.split(".")[1] not in ("envs", "tools", "sandbox", "trainers")
    }
    bad = []
    for mod in sorted(core):
        unit = mod.split(".")[1]
        if unit not in rank:
            bad.append(
                f"agentrl/{unit}: no layer; add {unit!r} to CORE_LAYERS in tests/test_packaging.py and to "
                "the layer table in docs/architecture.md"
            )
            continue
        for dep, (path, lineno) in sorted(graph[mod].items()):
            if dep == "agentrl":
                bad.append(
                    f"{path.relative_to(root)}:{lineno} imports the package facade `agentrl`; import the "
                    "module that defines the name"
                )
                continue
            if dep not in core or dep.split(".")[1] not in rank:
                continue
            dep_unit = dep.split(".")[1]
            if rank[dep_unit] > rank[unit]:
                bad.append(
                    f"{path.relative_to(root)}:{lineno} ({names[rank[unit]]} layer) imports {dep} "
                    f"({names[rank[dep_unit]]} layer, above it); move the shared piece down or the "
                    "importer up"
                )
    return sorted(set(bad))


def find_cycles(graph: dict[str, dict[str, tuple[Path, int]]]) -> list[list[str]]:
    """The import cycles of ``graph``: each strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(cycles)


@pytest.mark.parametrize("folder", sorted(LAYERS))
def test_imports_point_one_way(folder):
    bad = []
    known = set(import_graph())  # so `from agentrl import tools` reads as agentrl.tools
    for path in (ROOT / folder).rglob("*.py"):
        for lineno, mod in _imports(path, module_name(path, ROOT / folder, LAYERS[folder]), known):
            for forbidden in FORBIDDEN[folder]:
                top = forbidden.split(".")[1]
                if mod in (forbidden, top) or mod.startswith((forbidden + ".", top + ".")):
                    bad.append(f"{path.relative_to(ROOT)}:{lineno} imports {mod}")
    assert not bad, "imports against the layer order:\n" + "\n".join(bad)


def test_core_modules_import_only_their_layer_and_below():
    bad = layer_violations(import_graph())
    assert not bad, (
        "imports against the core's layers (CORE_LAYERS in tests/test_packaging.py):\n" + "\n".join(bad)
    )


def test_no_import_cycles():
    cycles = find_cycles(import_graph())
    assert not cycles, (
        "import cycles (break each by moving the shared piece into a module both can import):\n"
        + ("\n".join(" <-> ".join(c) for c in cycles))
    )


def test_docs_draw_the_layers_the_test_enforces():
    text = (ROOT / "docs" / "architecture.md").read_text().split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1:3] for line in text.splitlines() if line.startswith("| ") and "`" in line]
    drawn = tuple((name.strip(), frozenset(m.strip(" `") for m in mods.split(","))) for name, mods in rows)
    assert drawn == CORE_LAYERS, "docs/architecture.md's layer table and CORE_LAYERS differ"


def test_layer_and_cycle_checks_catch_planted_violations(tmp_path):
    core = tmp_path / "agentrl"
    core.mkdir()
    (core / "__init__.py").write_text("")
    (core / "errors.py").write_text("from agentrl.update import policy_update\n")  # bottom imports top
    (core / "update.py").write_text("import agentrl.errors\n")
    (core / "newthing.py").write_text("")
    graph = import_graph(tmp_path, {"agentrl": "agentrl"})
    assert graph["agentrl.errors"] == {"agentrl.update": (core / "errors.py", 1)}
    bad = layer_violations(graph, tmp_path)
    assert any(b.startswith("agentrl/errors.py:1 (foundation layer) imports agentrl.update") for b in bad), (
        bad
    )
    assert any(b.startswith("agentrl/newthing: no layer") for b in bad), bad
    assert find_cycles(graph) == [["agentrl.errors", "agentrl.update"]]


def test_core_tests_mirror_the_modules_they_test():
    """``tests/core/test_<module>[_<aspect>].py``: each core test file is named after the agentrl module it
    tests, so the tests of a module are found by its name."""
    modules = {p.stem for p in (ROOT / "agentrl").glob("*.py")} | {
        p.parent.name for p in (ROOT / "agentrl").glob("*/__init__.py")
    }
    stray = [
        p.name
        for p in sorted((ROOT / "tests" / "core").glob("test_*.py"))
        if not any(p.stem == f"test_{m}" or p.stem.startswith(f"test_{m}_") for m in modules)
    ]
    assert stray == [], f"rename them test_<module>[_<aspect>].py after the agentrl module they test: {stray}"


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
