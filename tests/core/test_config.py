"""Typed configs from flags: help from docstrings, dotted overrides, clear rejections."""

import argparse
import dataclasses
from enum import StrEnum
from typing import Literal

import pytest

from agentrl.config import (
    add_config_arguments,
    config_from_args,
    config_from_dict,
    config_to_dict,
    field_docs,
)
from agentrl.errors import ConfigError


class Est(StrEnum):
    OTB = "otb"
    GRPO = "grpo"


@dataclasses.dataclass(frozen=True)
class Inner:
    lr: float = 1e-5
    """Learning rate."""
    loss: Literal["token-mean", "seq-mean"] = "token-mean"
    """How token losses are aggregated."""


@dataclasses.dataclass(frozen=True)
class Outer:
    group_size: int = 4
    """Episodes per task."""
    estimator: Est = Est.OTB
    """Advantage estimator."""
    out: str | None = None
    """Run directory."""
    stop: tuple[int, ...] = (1, 2)
    """Stop ids."""
    learner: Inner = dataclasses.field(default_factory=Inner)
    """Learner settings."""

    def __post_init__(self):
        if self.group_size < 1:
            raise ConfigError("group_size must be >= 1")


def parse(argv):
    p = argparse.ArgumentParser(exit_on_error=False)
    add_config_arguments(p, Outer, aliases={"lr": "learner.lr"})
    return config_from_args(Outer, p.parse_args(argv)), p


def test_defaults_flags_dashes_dots_and_aliases():
    cfg, _ = parse([])
    assert cfg == Outer()
    cfg, _ = parse(["--group-size", "8", "--estimator", "grpo", "--learner.loss", "seq-mean", "--lr", "3e-4"])
    assert cfg.group_size == 8 and cfg.estimator is Est.GRPO
    assert cfg.learner == Inner(lr=3e-4, loss="seq-mean")
    cfg, _ = parse(["--out", "none", "--stop", "5,6,7"])
    assert cfg.out is None and cfg.stop == (5, 6, 7)


def test_help_shows_docstrings_and_choices():
    _, p = parse([])
    text = p.format_help()
    assert "Episodes per task. (default: 4)" in text
    assert "{otb,grpo}" in text and "{token-mean,seq-mean}" in text


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--group-size", "four"], "--group_size: cannot read 'four' as int"),
        (["--estimator", "ppo"], "'ppo' is not a valid Est"),
        (["--learner.loss", "sum"], "expected one of"),
        (["--group-size", "0"], "group_size must be >= 1"),
    ],
)
def test_bad_values_are_rejected_with_the_flag_named(argv, match):
    with pytest.raises(ConfigError, match=match):
        parse(argv)


def test_unknown_flag_is_rejected(capsys):
    _, p = parse([])
    with pytest.raises(SystemExit):
        p.parse_args(["--nonsense", "1"])
    assert "unrecognized arguments: --nonsense" in capsys.readouterr().err


def test_dict_round_trip_and_unknown_keys():
    cfg = Outer(group_size=2, learner=Inner(lr=0.1))
    assert config_from_dict(Outer, config_to_dict(cfg)) == cfg
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['learner.lrr'\]"):
        config_from_dict(Outer, {"learner": {"lrr": 1}})
    assert field_docs(Outer)["learner"] == "Learner settings."
