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


# --------------------------------------------------------------------------------- replay --step K
def split_first_episode(scripted_run: Path, dst: Path, step: int) -> tuple[Path, int]:
    """A copy of the run whose first trajectory of ``step`` is sample 0 of a 2-sample episode (reward moved
    to sample 1, a copy of it written right after): the episode's return, the group's size in episodes and
    the step's other groups are unchanged. Returns (run path, run position of sample 0)."""
    from .helpers import copy_run

    run = copy_run(scripted_run, dst)
    path = run / "trajectories.jsonl"
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    k = next(i for i, r in enumerate(recs) if r["meta"]["step"] == step and r["reward"] != 0)
    a, b = recs[k], json.loads(json.dumps(recs[k]))
    a["meta"].update(sample_index=0, num_samples=2)
    b["meta"].update(sample_index=1, num_samples=2)
    a["rewards"], a["reward"] = [0.0] * len(a["rewards"]), 0.0
    recs.insert(k + 1, b)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return run, k


@pytest.mark.slow
def test_replay_step_recomputes_credit_across_the_samples(scripted_run: Path, tmp_path: Path, tok) -> None:
    from agentrl.trainers import replay as rerun
    from agentrl.trainers.replay.reproduce import step_batch

    path, k = split_first_episode(scripted_run, tmp_path / "run", 1)
    run = replay.load(path)
    _all_idx, trained = step_batch(run, 1)
    assert k in trained and k + 1 in trained and trained.index(k + 1) == trained.index(k) + 1
    assert len(trained) == 9  # the step's 8 episodes, one of them in two samples
    adv = rerun.step_advantages(run, 1, tokenizer=tok)
    assert set(adv) == set(trained)
    t0, t1 = run.trajectories[k], run.trajectories[k + 1]
    a0 = [x for x, m in zip(adv[k], t0.loss_mask, strict=True) if m]
    a1 = [x for x, m in zip(adv[k + 1], t1.loss_mask, strict=True) if m]
    # Sample 0 earned nothing itself, but its tokens' return-to-go includes what sample 1 earned: under
    # per-sample credit its advantages would be those of a zero-reward member (all below the baseline).
    assert all(x is not None for x in a0 + a1) and max(a0) > 0
    # The other groups of the step are credited as in the recorded run.
    orig = rerun.step_advantages(replay.load(scripted_run), 1, tokenizer=tok)
    gid = t0.meta.group_id
    for i in trained:
        t = run.trajectories[i]
        if t.meta.group_id != gid:
            j = i if i < k else i - 1  # positions after the inserted line moved by one
            assert adv[i] == pytest.approx(orig[j], abs=1e-6)


def test_reexec_of_a_later_sample_says_why_it_cannot_run() -> None:
    from agentrl._sync import run_sync
    from agentrl.trainers.replay.reexec import areexec

    later = dataclasses.replace(traj("a", 1, 3), actions=("yo",))
    rep = run_sync(areexec(later, env_factory=lambda: pytest.fail("no env is built")))
    # Not a failure and not a difference: a record that cannot be re-executed alone (issue 47, point 3;
    # areexec_episode and `agentrl replay --reexec` replay it after its earlier samples).
    assert "sample 1 of the 3-sample episode a" in rep.not_reexecutable and rep.steps == ()
    assert not rep.error and not rep.ok
