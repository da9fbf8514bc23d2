"""A gateway session that goes on after a turn cut by ``max_tokens`` splits with the reason
``after_length_cut`` (issue #32), and every place that shows a trajectory says which session and segment it
is: ``agentrl replay``'s list (and its JSON), ``--show`` and the HTML page."""

from __future__ import annotations

import json

from agentrl import JsonlStore
from agentrl.config import config_to_dict
from agentrl.trainers.cli import main
from agentrl.trainers.gateway import Gateway
from agentrl.trainers.gateway.cli import ServeConfig

from .helpers import START, ask, client_for, scripted


async def _record(renderer, out):
    out.mkdir()
    (out / "config.json").write_text(json.dumps(config_to_dict(ServeConfig(model="tiny", out=str(out)))))
    store = JsonlStore(out / "trajectories.jsonl")
    policy = scripted(renderer, ("Answer: hello world and more", "Answer: hello"))
    async with Gateway(policy, renderer, store=store) as gw:
        c = client_for(gw.base_url("sess-1"))
        a, finish = await ask(c, START, max_tokens=3)
        assert finish == "length"
        await ask(c, [*START, a, {"role": "user", "content": "Go on."}])
        await c.close()
        await gw.finish("sess-1", 1.0)
    store.close()


async def test_split_sessions_are_shown_with_their_segment(renderer, tmp_path, capsys):
    out = tmp_path / "gw"
    await _record(renderer, out)
    assert main(["replay", str(out), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["list"]
    assert [(r["session_id"], r["segment"], r["segment_end"]) for r in rows] == [
        ("sess-1", 0, "after_length_cut"),
        ("sess-1", 1, "finish"),
    ]
    assert main(["replay", str(out)]) == 0
    listing = capsys.readouterr().out
    assert "session#segment" in listing
    assert "sess-1#0 after_length_cut" in listing and "sess-1#1 " in listing
    assert main(["replay", str(out), "--show", "0", "--color", "never"]) == 0
    assert "session sess-1, segment 0 of 2, ended by after_length_cut" in capsys.readouterr().out
    page = tmp_path / "run.html"
    assert main(["replay", str(out), "--html", str(page)]) == 0
    html = page.read_text()
    assert "session sess-1, segment 1 of 2, ended by finish" in html and '["gateway", t.session]' in html
