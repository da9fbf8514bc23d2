"""The offline replay package stays in the core's lower floors: it never imports learner or model code."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEAVY = (
    "torch",
    "transformers",
    "agentrl.learner",
    "agentrl.models",
    "agentrl.update",
    "agentrl.credit",
    "agentrl.checkpoint",
    "agentrl.policies",
    "agentrl.rollout",
    "agentrl.registry",
    "agentrl.trainers",
    "agentrl.envs",
)


def _imported(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_replay_modules_import_no_model_or_learner_code() -> None:
    bad = [
        f"{p.relative_to(ROOT)} imports {m}"
        for p in sorted((ROOT / "agentrl" / "replay").glob("*.py"))
        for m in _imported(p)
        if any(m == h or m.startswith(h + ".") for h in HEAVY)
    ]
    assert not bad, "\n".join(bad)


def test_importing_replay_loads_no_model_or_learner_code() -> None:
    code = (
        "import sys, agentrl\n"
        "before = set(sys.modules)\n"
        "import agentrl.replay\n"
        "print(' '.join(sorted(set(sys.modules) - before)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    new = out.stdout.split()
    assert "agentrl.replay.consistency" in new  # the probe sees what the import brought in
    heavy = [m for m in new if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert not heavy, heavy
