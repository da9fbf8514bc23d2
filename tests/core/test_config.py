"""Typed configs from flags: help from docstrings, dotted overrides, clear rejections."""

import argparse
import dataclasses
from enum import StrEnum
from typing import ClassVar, Literal

import pytest

from agentrl.config import (
    FLAT_FLAGS,
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


# ---------------------------------------------------------------------------------------------------
# Choices: a field typed as a union of self-naming dataclasses (how the advantage estimators are typed)
@dataclasses.dataclass(frozen=True)
class Mean:
    """Group mean."""

    name: ClassVar[str] = "mean"
    eps: float = 1e-6
    """Added to the std."""
    scale: bool = True
    """Divide by the std."""


@dataclasses.dataclass(frozen=True)
class Leave:
    """Leave one out."""

    name: ClassVar[str] = "leave"
    eps: float = 0.5
    """Smoothing."""


@dataclasses.dataclass(frozen=True)
class WithChoice:
    baseline: Mean | Leave = dataclasses.field(default_factory=Leave)
    """How the baseline is made."""
    inner: Inner = dataclasses.field(default_factory=lambda: Inner(lr=0.5))
    """Inner settings."""


def parse_choice(argv, base=None):
    p = argparse.ArgumentParser(exit_on_error=False)
    add_config_arguments(p, WithChoice)
    return config_from_args(WithChoice, p.parse_args(argv), base=base), p


def test_choice_is_selected_by_name_and_configured_by_dotted_options():
    assert parse_choice([])[0] == WithChoice()
    assert parse_choice(["--baseline", "mean"])[0].baseline == Mean()
    want = Mean(scale=False, eps=0.25)
    assert (
        parse_choice(["--baseline", "mean", "--baseline.scale", "false", "--baseline.eps", "0.25"])[
            0
        ].baseline
        == want
    )
    # The order of the flags does not matter: an option given first applies to the member picked later.
    assert (
        parse_choice(["--baseline.eps", "0.25", "--no-baseline.scale", "--baseline", "mean"])[0].baseline
        == want
    )
    # Without --baseline, options apply to the default member.
    assert parse_choice(["--baseline.eps", "0.1"])[0].baseline == Leave(eps=0.1)


@pytest.mark.parametrize(
    "argv, match",
    [
        (["--baseline", "median"], r"--baseline: cannot read 'median': expected one of \['mean', 'leave'\]"),
        (
            ["--baseline.scale", "false"],
            r"--baseline.scale does not apply to --baseline leave \(its options: --baseline.eps\)",
        ),
        (["--baseline", "mean", "--baseline.eps", "x"], "--baseline.eps: cannot read 'x' as float"),
    ],
)
def test_bad_choices_are_rejected_with_the_flag_named(argv, match):
    with pytest.raises(ConfigError, match=match):
        parse_choice(argv)


def test_choice_help_lists_members_and_each_option_per_member():
    text = " ".join(parse_choice([])[1].format_help().split())
    assert "{mean,leave} (default: 'leave')" in text
    assert "--baseline NAME picks one: mean = Group mean; leave = Leave one out." in text
    assert "mean: Added to the std. (default: 1e-06); leave: Smoothing. (default: 0.5)" in text
    assert "--no-baseline.scale" in text


def test_choice_overrides_start_from_the_base():
    base = WithChoice(baseline=Mean(eps=0.2, scale=False))
    assert parse_choice(["--baseline.eps", "0.3"], base)[0].baseline == Mean(eps=0.3, scale=False)
    assert parse_choice(["--baseline", "mean"], base)[0].baseline == Mean(eps=0.2, scale=False)
    # Another member starts from its own defaults, not from the old member's options.
    assert parse_choice(["--baseline", "leave"], base)[0].baseline == Leave()


def test_choice_dict_forms():
    cfg = WithChoice(baseline=Mean(scale=False))
    data = config_to_dict(cfg)
    assert data["baseline"] == {"name": "mean", "eps": 1e-6, "scale": False}
    assert config_from_dict(WithChoice, data) == cfg
    assert config_from_dict(WithChoice, {"baseline": "mean"}).baseline == Mean()  # a bare name
    assert config_from_dict(WithChoice, {"baseline": {"eps": 0.0}}).baseline == Leave(eps=0.0)
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) of leave \['baseline.scale'\]"):
        config_from_dict(WithChoice, {"baseline": {"name": "leave", "scale": True}})
    with pytest.raises(ConfigError, match="baseline: unknown name 'median'"):
        config_from_dict(WithChoice, {"baseline": "median"})


def test_partial_nested_settings_keep_the_enclosing_default():
    # WithChoice's default inner has lr=0.5 (not Inner's 1e-5): setting another inner field keeps it.
    assert parse_choice(["--inner.loss", "seq-mean"])[0].inner == Inner(lr=0.5, loss="seq-mean")
    assert config_from_dict(WithChoice, {"inner": {"loss": "seq-mean"}}).inner.lr == 0.5


def test_errors_of_nested_configs_name_where():
    @dataclasses.dataclass(frozen=True)
    class Strict:
        n: int = 1

        def __post_init__(self):
            if self.n < 1:
                raise ConfigError(f"n must be >= 1, got {self.n}")

    @dataclasses.dataclass(frozen=True)
    class Holder:
        strict: Strict = dataclasses.field(default_factory=Strict)

    with pytest.raises(ConfigError, match=r"^strict: n must be >= 1, got 0$"):
        config_from_dict(Holder, {"strict": {"n": 0}})


@dataclasses.dataclass(frozen=True)
class Where:
    address: str | None = None
    """Cluster address."""
    workers: int = 1
    """Worker count."""
    verbose: bool = False
    """Say more."""


@dataclasses.dataclass(frozen=True)
class Split:
    steps: int = 2
    """Steps."""
    where: Where = dataclasses.field(default_factory=Where, metadata=FLAT_FLAGS)
    """Where it runs (its settings keep their flat flags)."""
    learner: Inner = dataclasses.field(default_factory=Inner)
    """Learner settings."""


def test_a_flat_nested_config_keeps_its_flags_and_reads_its_old_flat_dict():
    """A config split out of its enclosing one (``metadata=FLAT_FLAGS``): the flags are the ones its fields
    had before the split, the dict form is nested, and the flat form of before the split still reads."""
    p = argparse.ArgumentParser(exit_on_error=False)
    add_config_arguments(p, Split)
    flags = {o for a in p._actions for o in a.option_strings}
    assert {"--address", "--workers", "--verbose", "--no-verbose", "--learner.lr"} <= flags
    assert not any(f.startswith("--where") for f in flags)
    cfg = config_from_args(Split, p.parse_args(["--address", "a:1", "--workers", "3", "--verbose", "true"]))
    assert cfg == Split(where=Where(address="a:1", workers=3, verbose=True))
    assert config_from_args(Split, p.parse_args(["--no-verbose"]), base=cfg).where.verbose is False
    with pytest.raises(ConfigError, match=r"^--workers: cannot read 'x' as int"):
        config_from_args(Split, p.parse_args(["--workers", "x"]))
    assert config_to_dict(cfg) == {
        "steps": 2,
        "where": {"address": "a:1", "workers": 3, "verbose": True},
        "learner": {"lr": 1e-5, "loss": "token-mean"},
    }
    assert config_from_dict(Split, config_to_dict(cfg)) == cfg
    # The form of before the split: the settings at the top level, lifted into the nested config.
    assert config_from_dict(Split, {"steps": 2, "address": "a:1", "workers": 3, "verbose": True}) == cfg
    assert config_from_dict(Split, {"address": "a:1", "where": {"workers": 3, "verbose": True}}) == cfg
    with pytest.raises(ConfigError, match=r"\['workers'\] given both at the top level .* and in 'where'"):
        config_from_dict(Split, {"workers": 3, "where": {"workers": 2}})
    with pytest.raises(ConfigError, match=r"unknown setting\(s\) \['lr'\]"):  # only a flat config lifts
        config_from_dict(Split, {"lr": 0.1})


def test_help_spells_flags_with_hyphens_and_underscores_still_parse():
    # Issue 47: the usage lines said --group_size while the docs say --group-size.
    from agentrl.trainers.cli import build_parser

    parser = build_parser()
    train = next(a for a in parser._subparsers._group_actions if a.dest == "command").choices["train"]  # type: ignore[union-attr]
    usage = train.format_usage()
    assert "[--group-size INT]" in usage and "[--rollout.max-new-tokens INT]" in usage
    assert "--group_size" not in usage and "max_new_tokens" not in usage
    _, p = parse([])
    assert p.parse_args(["--group_size", "3"]) == p.parse_args(["--group-size", "3"])
