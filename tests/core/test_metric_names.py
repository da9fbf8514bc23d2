"""One registry of metric names: every name a producer of the step's row writes is registered, and every
registered name has a producer."""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from pathlib import Path

import agentrl
from agentrl.credit import VarianceProxy
from agentrl.learner import LearnerStats
from agentrl.metric_names import METRIC_FAMILIES, METRICS, is_registered, unregistered
from agentrl.metrics import PLOT_GROUPS

ROOT = Path(agentrl.__file__).resolve().parent.parent
PRODUCERS = (
    "trainers/step_metrics.py",
    "trainers/loop.py",
    "agentrl/dynamic_sampling.py",
    "agentrl/update.py",
    "agentrl/learner/correction.py",
    "agentrl/learner/stability.py",
    "trainers/ray/runtime.py",
)
"""The modules that write names into a step's row by literal (the dataclass-made names are below)."""
_NAME = re.compile(r"^[a-z]+/[a-z0-9_]+$")


def _literal_names() -> dict[str, str]:
    found: dict[str, str] = {}
    for rel in PRODUCERS:
        for node in ast.walk(ast.parse((ROOT / rel).read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and _NAME.match(node.value):
                found.setdefault(node.value, rel)
    return found


def _dataclass_names() -> set[str]:
    nan = math.nan
    stats = LearnerStats(0.0, 0.0, 0.0, nan, 0.0, 0.0, nan, nan, 0, 0, 0, False)
    proxy = VarianceProxy(1.0, 1.0, 1.0, 1.0, 1.0, 2)
    return set(stats.to_dict(prefix="learn/")) | set(proxy.to_dict(prefix="variance/"))


def test_every_name_a_producer_writes_is_registered():
    written = set(_literal_names()) | _dataclass_names()
    assert unregistered(written) == [], "register them in agentrl/metric_names.py"


def test_every_registered_name_has_a_producer():
    written = set(_literal_names()) | _dataclass_names()
    assert sorted(set(METRICS) - written) == []


def test_plots_and_families_use_registered_names():
    assert [k for keys in PLOT_GROUPS.values() for k in keys if k not in METRICS] == []
    assert is_registered("reward/term/format") and not is_registered("reward/term/")
    assert unregistered(["step", "reward/mean", "reward/nope"]) == ["reward/nope"]
    assert all(p.endswith("/") for p in METRIC_FAMILIES)
    assert all(dataclasses.is_dataclass(m) and m.meaning and m.producer for m in METRICS.values())
