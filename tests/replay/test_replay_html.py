"""The HTML viewer: static checks of the page, then real headless Chromium driven over the DevTools protocol
(load the page, filter, click through to a trajectory, hover tokens, assert on the DOM, take a screenshot)."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from agentrl import replay
from agentrl.errors import ConfigError
from agentrl.replay.page import render_page
from agentrl.trainers import replay as rerun

from .cdp import Browser, find_chromium
from .helpers import copy_run

EVIL = '</script><img src=x onerror="window.__pwned=1"><script>window.__pwned=2</script>'


def test_page_is_self_contained_and_escapes_data() -> None:
    payload = {
        "title": "run <b>x</b>",
        "notes": [],
        "vocab": {"1": EVIL},
        "trajectories": [{"i": 0, "messages": [{"role": "user", "content": EVIL}]}],
    }
    page = render_page(payload)
    assert "<title>run &lt;b&gt;x&lt;/b&gt;</title>" in page
    # The data block cannot be closed early by what it carries; it parses back to the same payload.
    block = re.search(r'<script id="data" type="application/json">(.*?)</script>', page, re.S)
    assert block is not None and EVIL not in block.group(1)
    assert json.loads(block.group(1)) == payload
    assert page.count("<script") == 2 and page.count("</script>") == 2
    shell = page.replace(block.group(1), "")
    # Nothing to fetch: no src/href attribute, no CSS url() or @import.
    assert not re.search(r"\b(src|href)\s*=\s*[\"']|url\(|@import", shell)
    assert "http://" not in shell and "https://" not in shell
    assert "default-src 'none'" in page  # and the CSP forbids fetching anything anyway


def test_write_html_without_a_tokenizer(tmp_path: Path) -> None:
    from agentrl.types import Message, Segment, TokenSource, Trajectory

    t = Trajectory(
        token_ids=(5, 6, 7),
        loss_mask=(0, 1, 1),
        logprobs=(None, -0.1, -0.2),
        segments=(Segment(TokenSource.PROMPT, 0, 1, -1, 0), Segment(TokenSource.MODEL, 1, 3, 0, 1)),
        messages=(Message("user", "hi"), Message("assistant", "yo")),
    )
    page = replay.write_html([t], tmp_path / "p.html").read_text()
    data = json.loads(re.search(r'type="application/json">(.*?)</script>', page, re.S).group(1))  # type: ignore[union-attr]
    assert data["notes"] == ["no tokenizer: tokens are shown as ids"] and data["vocab"] == {}
    (tr,) = data["trajectories"]
    assert tr["ids"] == [5, 6, 7] and tr["lp"] == [None, -0.1, -0.2] and tr["adv"] is None
    with pytest.raises(ConfigError, match="2 trajectories for one page"):
        replay.write_html([t, t], tmp_path / "q.html", max_trajectories=1)


# ---------------------------------------------------------------------------------------------------
def set_value(b: Browser, element_id: str, value: str, event: str = "change") -> None:
    """Pick a <select> option (headless, native pop-ups cannot be clicked) or set a field, as a user would."""
    el, val, ev = json.dumps(element_id), json.dumps(value), json.dumps(event)
    b.eval(f"document.getElementById({el}).value = {val}")
    b.eval(f"document.getElementById({el}).dispatchEvent(new Event({ev}))")


@pytest.fixture(scope="module")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip("no chromium binary on PATH (Debian package `chromium`, installed by .ci/setup --dev)")
    return path


@pytest.mark.slow
def test_viewer_in_headless_chromium(chromium: str, scripted_run: Path, tok: Any, tmp_path: Path) -> None:
    src = replay.load(scripted_run)
    k_evil = next(
        i for i, t in enumerate(src.trajectories) if any(c.status.value == "ok" for c in t.tool_calls)
    )

    def inject(i: int, rec: dict[str, Any]) -> dict[str, Any]:
        if i == k_evil:  # model text that is also markup must render as text
            rec["messages"][-1]["content"] += EVIL
        return rec

    run = replay.load(copy_run(scripted_run, tmp_path / "run", edit=inject))
    adv: dict[int, Any] = {}
    for step in (0, 1):
        adv.update(rerun.step_advantages(run, step, tokenizer=tok))
    rec = rerun.recompute_run(run, tokenizer=tok)
    page = replay.write_html(run, tmp_path / "run.html", tokenizer=tok, advantages=adv, recomputed=rec)

    k = next(
        i
        for i, t in enumerate(run.trajectories)
        if t.reward == 1.0 and t.tool_calls and t.tool_calls[0].status.value == "ok" and i != k_evil
    )
    t = run.trajectories[k]
    shot = tmp_path / "replay.png"
    with Browser(chromium, tmp_path / "profile") as b:
        b.navigate(page.as_uri())
        assert b.eval("document.body.dataset.ready") == "1"
        assert b.eval("document.querySelectorAll('#list tbody tr').length") == 16
        assert b.eval("document.getElementById('count').textContent") == "16 of 16 trajectories"

        # Filters: type into the search box, pick a tool status.
        b.type_text("#q", "syntaxerror")
        assert b.eval("document.getElementById('count').textContent") == "4 of 16 trajectories"
        set_value(b, "q", "", "input")
        set_value(b, "f-tool", "error")
        rows = b.eval("[...document.querySelectorAll('#list tbody tr')].map(r => Number(r.dataset.i))")
        assert sorted(rows) == [
            i
            for i, x in enumerate(run.trajectories)
            if x.tool_calls and x.tool_calls[0].status.value == "error"
        ]
        b.eval(
            "const s = document.getElementById('f-tool'); s.value = ''; s.dispatchEvent(new Event('change'))"
        )

        # Click through to one trajectory.
        b.click(f'#list tbody tr[data-i="{k}"]')
        assert b.eval("document.getElementById('d-title').textContent").startswith(
            f"trajectory {k} · reward 1.000"
        )
        assert b.eval("location.hash") == f"#t{k}"
        assert b.eval("document.querySelector('#list tr.sel').dataset.i") == str(k)
        assert b.eval("document.querySelectorAll('#transcript .msg').length") == len(t.messages)
        assert b.eval("document.querySelector('#transcript .badge').textContent") == "python ok"
        call = t.tool_calls[0]
        assert call.call_id in b.eval("document.querySelector('#transcript .call').textContent")

        b.click("#tab-tools")
        assert b.eval("document.getElementById('tools').hidden") is False
        assert b.eval("document.getElementById('transcript').hidden") is True
        row = f'#tools tr[data-call="{call.call_id}"] td'
        cells = b.eval(f"[...document.querySelectorAll({json.dumps(row)})].map(c => c.textContent)")
        assert cells[0] == call.call_id and cells[3] == "ok" and cells[6] == call.output

        b.click("#tab-tokens")
        n_spans = b.eval("document.querySelectorAll('#stream span.tok').length")
        assert n_spans == len(t.token_ids)
        assert b.eval("document.querySelectorAll('#stream span.tok.m1').length") == t.num_model_tokens
        seg = next(s for s in t.segments if s.source.value == "model")
        obs = next(s for s in t.segments if s.source.value == "observation")
        bg = "getComputedStyle(document.querySelector('#stream span[data-k=\"%d\"]')).backgroundColor"
        assert b.eval(bg % seg.start) == "rgb(187, 247, 208)"  # model / mask 1
        assert b.eval(bg % obs.start) == "rgb(186, 230, 253)"  # observation
        assert b.eval(bg % 0) == "rgb(229, 231, 235)"  # prompt

        # Hover shows the details of a token; a click pins them.
        top = b.eval(
            f"document.querySelector('#stream span[data-k=\"{seg.start}\"]').getBoundingClientRect().top"
        )
        b.hover(f'#stream span[data-k="{seg.start}"]')
        # Showing the details must not move the tokens (the pointer would land on another one).
        assert (
            b.eval(
                f"document.querySelector('#stream span[data-k=\"{seg.start}\"]').getBoundingClientRect().top"
            )
            == top
        )
        assert b.eval("document.getElementById('tip').hidden") is False
        tip = b.eval("document.getElementById('tip').textContent")
        assert f"token {seg.start}  id {t.token_ids[seg.start]}" in tip
        assert "source model  turn 0  mask 1" in tip and "log-prob -0.5000" in tip
        a = adv[k][seg.start]
        assert f"advantage {a:.4f}" in tip and "recomputed -1" in tip and "Σπ²" in tip
        b.click(f'#stream span[data-k="{obs.start}"]')
        assert "source observation" in b.eval("document.getElementById('tok-info').textContent")
        assert b.eval("document.querySelectorAll('#stream .tok.pin').length") == 1

        # Colour by advantage: a winning episode's tokens are green (hue 140), others uncoloured.
        set_value(b, "color-by", "advantage")
        red, green, _blue = map(int, re.findall(r"\d+", b.eval(bg % seg.start))[:3])
        assert a > 0 and green > red  # positive advantage: green
        assert b.eval(bg % obs.start) == "rgba(0, 0, 0, 0)"  # not trained on: no colour
        set_value(b, "color-by", "logprob")
        assert "log p" in b.eval("document.getElementById('legend').textContent")
        red, green, _blue = map(int, re.findall(r"\d+", b.eval(bg % seg.start))[:3])
        assert red > green  # log p = -0.5 is light red, not the advantage's green
        b.screenshot(shot)

        # Markup inside a message stays text.
        b.eval(f"location.hash = '#t{k_evil}'")  # deep links work, also within the page
        b.click("#tab-transcript")
        assert b.eval("document.getElementById('d-title').textContent").startswith(f"trajectory {k_evil}")
        assert EVIL in b.eval("document.getElementById('transcript').textContent")
        assert b.eval("typeof window.__pwned") == "undefined"
        assert b.eval("document.querySelectorAll('#transcript img, #transcript script').length") == 0

        assert b.exceptions() == []
        urls = b.requested_urls()
        assert urls and all(u.startswith("file://") for u in urls), urls

    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    keep = os.environ.get("AGENTRL_TEST_ARTIFACTS")
    if keep:  # CI can keep the screenshot for a human to look at
        Path(keep).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(keep) / "replay-viewer.png")
