"""Replay of multi-sample episodes: the viewer shows an episode as its linked samples."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from agentrl import replay
from agentrl.types import Message, Segment, TokenSource, Trajectory, TrajectoryMeta

from .cdp import Browser, find_chromium


def traj(episode: str, k: int = 0, n: int = 1, reward: float = 0.0, text: str = "yo") -> Trajectory:
    return Trajectory(
        token_ids=(5, 6, 7),
        loss_mask=(0, 1, 1),
        logprobs=(None, -0.1, -0.2),
        segments=(Segment(TokenSource.PROMPT, 0, 1, -1, 0), Segment(TokenSource.MODEL, 1, 3, 0, 1)),
        messages=(Message("user", "hi"), Message("assistant", text)),
        rewards=(reward,),
        meta=TrajectoryMeta(group_id="g", task_id="t", episode_id=episode, sample_index=k, num_samples=n),
    )


def run_trajectories() -> list[Trajectory]:
    """A 3-sample episode written interleaved with a single-sample one: run positions 0, 1, 3 are ``a``."""
    return [
        traj("a", 0, 3, 0.0, "first context"),
        traj("a", 1, 3, 0.25, "after compaction"),
        traj("b", reward=1.0),
        traj("a", 2, 3, 0.5, "last context"),
    ]


def page_data(path: Path) -> dict:
    page = path.read_text()
    return json.loads(re.search(r'type="application/json">(.*?)</script>', page, re.S).group(1))  # type: ignore[union-attr]


def test_payload_links_each_sample_to_its_siblings(tmp_path: Path) -> None:
    data = page_data(replay.write_html(run_trajectories(), tmp_path / "p.html"))
    by_i = {t["i"]: t for t in data["trajectories"]}
    assert by_i[1]["ep"] == {"sample": 1, "samples": 3, "links": [[0, 0], [1, 1], [2, 3]], "return": 0.75}
    assert "ep" not in by_i[2]  # a single-sample episode is shown as before
    # Only some samples on the page: the others are named but not linked; a missing sample leaves no return.
    part = page_data(replay.write_html(run_trajectories(), tmp_path / "q.html", indices=[3]))
    assert part["trajectories"][0]["ep"]["links"] == [[0, None], [1, None], [2, 3]]
    gone = page_data(replay.write_html(run_trajectories()[:2], tmp_path / "r.html"))
    assert gone["trajectories"][0]["ep"]["return"] is None


@pytest.fixture(scope="module")
def chromium() -> str:
    path = find_chromium()
    if path is None:
        pytest.skip("no chromium binary on PATH (Debian package `chromium`, installed by .ci/setup --dev)")
    return path


@pytest.mark.slow
def test_viewer_walks_an_episodes_samples(chromium: str, tmp_path: Path) -> None:
    page = replay.write_html(run_trajectories(), tmp_path / "p.html")
    with Browser(chromium, tmp_path / "profile") as b:
        b.navigate(page.as_uri())
        assert b.eval("document.body.dataset.ready") == "1"
        firsts = b.eval("[...document.querySelectorAll('#list tbody tr')].map(r => r.cells[0].textContent)")
        assert firsts == ["0 · 1/3", "1 · 2/3", "2", "3 · 3/3"]
        b.click('#list tbody tr[data-i="0"]')
        buttons = "[...document.querySelectorAll('#d-samples button')]"
        assert b.eval(f"{buttons}.map(x => x.textContent)") == ["sample 0", "sample 1", "sample 2"]
        assert b.eval(f"{buttons}.map(x => x.disabled)") == [True, False, False]
        assert "0.750" in b.eval("document.getElementById('d-meta').textContent")
        b.click('#d-samples button[data-j="3"]')  # to the episode's last sample
        assert b.eval("document.getElementById('d-title').textContent").startswith("trajectory 3 ")
        assert b.eval("location.hash") == "#t3"
        assert "last context" in b.eval("document.getElementById('transcript').textContent")
        b.click('#d-samples button[data-j="1"]')
        assert "after compaction" in b.eval("document.getElementById('transcript').textContent")
        assert b.exceptions() == []


def test_a_sample_without_its_siblings_still_renders(tmp_path: Path) -> None:
    lone = dataclasses.replace(traj("z", 1, 2))
    data = page_data(replay.write_html([lone], tmp_path / "p.html"))
    assert data["trajectories"][0]["ep"]["links"] == [[0, None], [1, 0]]
