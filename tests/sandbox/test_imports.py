"""The sandbox package's own modules import each other without a cycle, and nothing shipped imports the
tests' e2b stand-in server."""

from __future__ import annotations

import ast
from pathlib import Path

import agentrl.sandbox

FOLDER = Path(agentrl.sandbox.__file__).parent


def _graph() -> dict[str, set[str]]:
    mods = {p.stem for p in FOLDER.glob("*.py")}
    graph: dict[str, set[str]] = {}
    for name in mods:
        deps: set[str] = set()
        for node in ast.walk(ast.parse((FOLDER / f"{name}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                deps |= {node.module.split(".")[0]} if node.module else {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agentrl.sandbox."):
                deps.add(node.module.split(".")[2])  # type: ignore[union-attr]
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def test_no_import_cycle_inside_the_sandbox_package():
    graph, done, path = _graph(), set(), []

    def visit(m: str) -> None:
        path.append(m)
        for d in sorted(graph[m]):
            assert d not in path, f"import cycle: {' -> '.join([*path[path.index(d) :], d])}"
            if d not in done:
                visit(d)
        path.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)
    assert "selftest" not in {d for m in ("_worker_client", "_layout", "_common") for d in graph[m]}
    assert "local" not in graph["selftest"] and "local" not in graph["docker"]


def test_the_e2b_stand_in_server_is_not_shipped():
    assert not (FOLDER / "e2b_server.py").exists()
    for p in FOLDER.glob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom | ast.Import):
                names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                names += [a.name for a in node.names]
                assert not any("e2b_server" in n for n in names), f"{p.name} imports the test server"
