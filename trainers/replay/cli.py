"""``agentrl replay PATH``: list, show, check, re-execute, re-score, recompute and reproduce recorded runs.

PATH is a run directory (made by ``agentrl train``) or a ``trajectories.jsonl``. With no mode flag the
trajectories matching the filters are listed; the modes can be combined::

    agentrl replay RUN                              # list (index, step, group, reward, stop, tools, question;
                                                    # gateway records also their session#segment)
    agentrl replay RUN --tool-status error --max-reward 0
    agentrl replay RUN --show 7 --tokens --advantages
    agentrl replay RUN --html run.html --advantages --recompute
    agentrl replay RUN --show 7 --reexec --rescore  # re-run its tool calls in a fresh env, re-score
    agentrl replay RUN --check                      # consistency of every record (mask, log-probs, tools)
    agentrl replay RUN --recompute [--model DIR]    # training-inference mismatch
    agentrl replay RUN --step 3                     # list step 3 and reproduce its advantages and loss
    agentrl replay RUN --step 3 --no-reproduce      # only list step 3's episodes

Exit status: 0 when everything matched, 1 when a check, re-execution, re-score or reproduction found a
difference (or ``--max-diff`` was exceeded), 2 on a usage or configuration error, 3 when nothing differed but
some records could not be re-executed (agent runs, a later sample without its earlier ones).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from agentrl import replay
from agentrl.errors import ConfigError
from agentrl.trainers.factories import env_arguments
from agentrl.trainers.replay.reexec import (
    NO_ENV_KWARGS,
    ReexecReport,
    RescoreReport,
    areexec_many,
    reexec_status,
)
from agentrl.trainers.replay.rejudge import add_group_terms, add_rejudge_arguments, rejudge_env_kwargs
from agentrl.trainers.replay.text import print_recompute, print_step
from agentrl.types import StopReason, ToolStatus, Trajectory

__all__ = ["add_parser", "run"]


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``replay`` subcommand to ``agentrl``'s subparsers."""
    p: argparse.ArgumentParser = subparsers.add_parser(
        "replay",
        help="list, show, check, re-execute and reproduce recorded trajectories",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("path", help="a run directory or a trajectories.jsonl file")
    f = p.add_argument_group("filters (listing, --check, --reexec, --rescore, --recompute, --html)")
    f.add_argument(
        "--step",
        type=int,
        help="training step (meta.step); alone on a run dir it also reproduces it (add --no-reproduce to "
        "only list its episodes)",
    )
    f.add_argument("--group", help="group id prefix or task id")
    f.add_argument("--min-reward", type=float, help="total reward >= this")
    f.add_argument("--max-reward", type=float, help="total reward <= this")
    f.add_argument("--stop-reason", choices=sorted(s.value for s in StopReason), help="why the episode ended")
    f.add_argument(
        "--errors",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="only episodes with (--errors) or without (--no-errors) a failure or non-ok tool call",
    )
    f.add_argument(
        "--tool-status", choices=sorted(s.value for s in ToolStatus), help="some tool call ended so"
    )
    f.add_argument("--grep", help="case-insensitive text in messages, tool calls and outputs, errors")
    f.add_argument("--limit", type=int, default=None, help="take at most this many (the first in file order)")
    m = p.add_argument_group("modes")
    m.add_argument("--show", type=int, metavar="K", help="render trajectory K (its index in the listing)")
    m.add_argument("--tokens", action="store_true", help="with --show: one line per sampled token (log-prob)")
    m.add_argument(
        "--advantages", action="store_true", help="with --show/--html: per-token advantages (run's estimator)"
    )
    m.add_argument("--html", metavar="OUT", help="write one self-contained HTML page to browse the selection")
    m.add_argument(
        "--check", action="store_true", help="check each record's mask, log-probs, tokens and tools"
    )
    m.add_argument(
        "--reexec", action="store_true", help="re-run every recorded tool call in a fresh env; diff"
    )
    m.add_argument("--rescore", action="store_true", help="recompute rewards with the env's checker; compare")
    m.add_argument(
        "--recompute", action="store_true", help="recompute log-probs and Σπ² of the recorded tokens; compare"
    )
    m.add_argument(
        "--model", help="with --recompute: this model folder (default: each episode's own checkpoint)"
    )
    m.add_argument("--no-reproduce", action="store_true", help="with --step: only list, do not reproduce")
    o = p.add_argument_group("options")
    o.add_argument("--tokenizer", help="tokenizer folder (default: the run's)")
    o.add_argument("--env-kwargs", help="JSON env arguments for --reexec/--rescore (default: the run's)")
    o.add_argument(
        "--concurrency", type=int, default=4, help="envs at once for --reexec/--rescore (default 4)"
    )
    o.add_argument("--device", default=None, help="cpu or cuda for --step/--recompute/--advantages")
    o.add_argument(
        "--dtype", default=None, choices=["float32", "bfloat16"], help="weights dtype (default: run's)"
    )
    o.add_argument("--rtol", type=float, default=1e-4, help="--step: relative tolerance (default 1e-4)")
    o.add_argument("--atol", type=float, default=1e-6, help="--step: absolute tolerance (default 1e-6)")
    o.add_argument(
        "--max-diff", type=float, default=None, help="--recompute: exit 1 if a |Δ log-prob| exceeds it"
    )
    o.add_argument(
        "--top", type=int, default=10, help="--recompute: largest differences to list (default 10)"
    )
    o.add_argument("--color", choices=["auto", "always", "never"], default="auto", help="ANSI colours")
    o.add_argument("--json", action="store_true", help="print the results as one JSON object")
    add_rejudge_arguments(p)
    return p


# ---------------------------------------------------------------------------------------------------
def _jsonable(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        d = {f.name: _jsonable(getattr(x, f.name)) for f in dataclasses.fields(x)}
        for prop in ("ok", "matches", "abs_diff"):
            if hasattr(type(x), prop) and isinstance(getattr(type(x), prop), property):
                d[prop] = _jsonable(getattr(x, prop))
        return d
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and x != x:  # NaN
        return None
    return x


def _color(mode: str) -> bool:
    if mode == "always":
        return True
    if mode == "never":
        return False
    return sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def _question(t: Trajectory) -> str:
    n_init = min(
        (s.message_index for s in t.segments if s.message_index is not None and s.source.value == "model"),
        default=len(t.messages),
    )
    users = [m.content for m in t.messages[:n_init] if m.role == "user"]
    q = users[-1] if users else ""
    q = " ".join(q.split())
    return q if len(q) <= 60 else q[:57] + "..."


def _list_row(i: int, t: Trajectory) -> dict[str, Any]:
    counts: dict[str, int] = {}
    for c in t.tool_calls:
        counts[c.status.value] = counts.get(c.status.value, 0) + 1
    return {
        "index": i,
        "step": t.meta.step,
        "group": t.meta.group_id,
        "episode_id": t.meta.episode_id,
        "reward": t.reward,
        "stop_reason": t.stop_reason.value,
        "turns": t.num_turns,
        "model_tokens": t.num_model_tokens,
        "tools": counts,
        "errors": len(t.errors),
        "question": _question(t),
        # gateway trajectories: the session and its segment (a session splits after a rewrite or a cut turn)
        "session_id": t.meta.extra.get("session_id"),
        "segment": t.meta.extra.get("segment"),
        "segment_end": t.meta.extra.get("segment_end"),
    } | (  # a multi-sample episode (compaction, sub-agents): which sample of how many
        {"sample_index": t.meta.sample_index, "num_samples": t.meta.num_samples}
        if t.meta.num_samples > 1
        else {}
    )


def _session_cell(r: dict[str, Any]) -> str:
    if r["session_id"] is None:
        return "-"
    end = "" if r["segment_end"] in (None, "finish") else f" {r['segment_end']}"
    return f"{str(r['session_id'])[:8]}#{r['segment'] or 0}{end}"


def _print_list(rows: list[dict[str, Any]], matched: int, total: int) -> None:
    sessions = any(r["session_id"] is not None for r in rows)  # a column only for gateway records
    width = max(15, *(len(_session_cell(r)) for r in rows)) if sessions else 0
    head = f"{'session#segment':{width}} " if sessions else ""
    print(
        f"{'#':>4} {'step':>4} {'group':8} {head}{'reward':>6} {'stop':13} {'turns':>5} {'tok':>5}  "
        f"{'tools':16} question"
    )
    for r in rows:
        tools = ", ".join(f"{v} {k}" for k, v in sorted(r["tools"].items())) or "-"
        if r["errors"]:
            tools += f" !{r['errors']}"
        step = "-" if r["step"] is None else r["step"]
        cell = f"{_session_cell(r):{width}} " if sessions else ""
        print(
            f"{r['index']:>4} {step:>4} {r['group'][:8]:8} {cell}{r['reward']:>6.2f} {r['stop_reason']:13} "
            f"{r['turns']:>5} {r['model_tokens']:>5}  {tools:16} {r['question']}"
        )
    if len(rows) < matched:
        print(f"showing {len(rows)} of {matched} matching trajectories ({total} in all)")
    else:
        print(f"{matched} of {total} trajectories")


def _print_check(reports: Sequence[replay.CheckReport]) -> None:
    bad = [r for r in reports if not r.ok]
    for r in bad:
        print(f"trajectory {r.index} (episode {r.episode_id}): {len(r.findings)} problem(s)")
        for f in r.findings:
            where = []
            if f.token_index is not None:
                where.append(f"token {f.token_index}")
            if f.call_id is not None:
                where.append(f"call {f.call_id}")
            if f.turn is not None:
                where.append(f"turn {f.turn}")
            print(f"  [{f.kind}] {'@ ' + ', '.join(where) + ': ' if where else ''}{f.message}")
    audited = sum(r.audited for r in reports)
    print(
        f"check: {len(reports) - len(bad)} of {len(reports)} trajectories consistent"
        f" ({audited} with the full token audit)"
    )


def _indent(text: str, n: int = 6) -> str:
    return "\n".join(" " * n + line for line in text.splitlines())


def _print_reexec(reports: Sequence[ReexecReport]) -> None:
    decoded = sum(r.actions_source == "decoded" for r in reports)
    if decoded:
        print(
            f"note: {decoded} trajectories record no actions (written before trajectories stored the text "
            "handed to Env.step); replayed the model turns decoded from their tokens instead: those ending "
            "with a stop token, which are exactly the turns the rollout handed to the env"
        )
    reasons: set[str] = set()
    for r in reports:
        head = f"trajectory {r.index} (episode {r.episode_id[:12]}, {r.env_id} seed {r.seed})"
        if r.error:
            print(f"{head}: COULD NOT REPLAY: {r.error}")
            continue
        if r.not_reexecutable:
            said = r.not_reexecutable in reasons
            reasons.add(r.not_reexecutable)
            print(f"{head}: NOT RE-EXECUTABLE: {'as above' if said else r.not_reexecutable}")
            continue
        n = len(r.calls)
        print(f"{head}: {n} tool call(s), {'all identical' if r.ok else 'DIFFERENT'}")
        if r.actions_source == "none":
            print("  no model turn reached the env (each was cut by a token limit): only reset was replayed")
        if not r.reset_identical:
            print("  reset: the initial observation differs")
            print(_indent(r.reset_diff))
        for c in r.calls:
            status = (
                c.replayed_status
                if c.verdict == "identical"
                else f"{c.recorded_status} -> {c.replayed_status}"
            )
            print(f"  {c.call_id} {c.name} (turn {c.turn}): {c.verdict} [{status}]")
            if c.diff:
                print(_indent(c.diff))
        for s in r.steps:
            if s.error:
                print(f"  turn {s.turn}: the env raised {s.error}")
            elif not (s.observation_identical and s.assistant_identical):
                what = "observation" if not s.observation_identical else "parsed assistant message"
                print(f"  turn {s.turn}: the {what} differs")
                print(_indent(s.diff))
        if not r.end_matches and not any(s.error for s in r.steps):
            why = f" (the rollout's {r.rollout_end} limit ended it)" if r.rollout_end else ""
            print(
                f"  end (terminated, truncated): recorded {r.recorded_end}{why}, expected "
                f"{r.expected_end}, replayed {r.replayed_end}"
            )
    cut = sum(r.rollout_end is not None and r.end_matches for r in reports)
    same = sum(r.ok for r in reports)
    never = sum(bool(r.not_reexecutable) and not r.error for r in reports)
    differ = len(reports) - same - never
    print(
        f"reexec: {same} of {len(reports)} trajectories replayed identically, {differ} differed or failed, "
        f"{never} not re-executable"
    )
    if cut:
        print(
            f"  {cut} of them were ended by the rollout's own limit (turn_tokens, max_tokens, max_turns, "
            "template_mismatch), recorded truncated: the env never saw that end, so their replays end "
            "(terminated, truncated) = (False, False), as expected"
        )
    compacted = {r.episode_id for r in reports if r.recorded_compacted and not r.not_reexecutable}
    if compacted:
        print(
            f"  {len(compacted)} compacted episode(s) were re-executed sample by sample, each through one "
            "env (a later sample starts from the context the env compacted to)"
        )


def _print_rescore(reports: Sequence[RescoreReport]) -> None:
    ok = 0
    for r in reports:
        if r.error:
            print(f"trajectory {r.index}: COULD NOT RESCORE: {r.error}")
            continue
        if r.not_reexecutable:
            print(f"trajectory {r.index}: NOT RE-EXECUTABLE: {r.not_reexecutable}")
            continue
        rec = ", ".join(f"{x:g}" for x in r.recorded_rewards) or "none"
        new = ", ".join("-" if x is None else f"{x:g}" for x in r.replayed_rewards) or "none"
        mark = "same" if r.matches else "DIFFERENT"
        ok += r.matches
        replayed = "-" if r.replayed_reward is None else f"{r.replayed_reward:g}"
        print(
            f"trajectory {r.index}: recorded {r.recorded_reward:g} ({rec}), "
            f"rescored {replayed} ({new}): {mark}"
        )
    print(f"rescore: {ok} of {len(reports)} rewards reproduced")


# ---------------------------------------------------------------------------------------------------
def run(ns: argparse.Namespace) -> int:
    """Run ``agentrl replay`` with parsed arguments; returns the exit status."""
    # Here, not at the top: every agentrl command builds this parser (add_parser), and these import torch.
    from agentrl.trainers.replay.credit import advantages_of_step
    from agentrl.trainers.replay.mismatch import recompute, recompute_run
    from agentrl.trainers.replay.reproduce import reproduce_step
    from agentrl.trainers.replay.weights import find_tokenizer, train_config

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except ImportError:  # pragma: no cover - transformers is a dependency
        pass
    rn = replay.load(ns.path)
    for issue in rn.issues:
        print(f"warning: {issue.path}:{issue.line}: {issue.reason}", file=sys.stderr)
    out: dict[str, Any] = {}
    rc = 0
    tok_cache: list[Any] = []

    def tokenizer() -> Any:
        if not tok_cache:
            tok, which = find_tokenizer(rn, ns.tokenizer)
            tok_cache.append(tok)
            print(f"tokenizer: {which}", file=sys.stderr)
        return tok_cache[0]

    if ns.show is not None:
        if not 0 <= ns.show < len(rn.trajectories):
            raise ConfigError(f"--show {ns.show}: the run has trajectories 0..{len(rn.trajectories) - 1}")
        indices = [ns.show]
    else:
        indices = replay.select(
            rn,
            step=ns.step,
            group=ns.group,
            min_reward=ns.min_reward,
            max_reward=ns.max_reward,
            stop_reason=ns.stop_reason,
            errors=ns.errors,
            tool_status=ns.tool_status,
            grep=ns.grep,
        )
    matched = len(indices)
    if ns.limit is not None:
        indices = indices[: ns.limit]
    trajs = [rn.trajectories[i] for i in indices]
    modes = [ns.show is not None, ns.html, ns.check, ns.reexec, ns.rescore, ns.recompute]
    listing = not any(modes)
    emit: list[Callable[[], None]] = []

    if listing:
        rows = [_list_row(i, rn.trajectories[i]) for i in indices]
        out["list"] = rows
        emit.append(lambda: _print_list(rows, matched, len(rn.trajectories)))

    advantages: dict[int, tuple[float | None, ...]] | None = None
    adv_source: dict[int, str] = {}
    adv_notes: list[str] = []
    no_adv: dict[int, str] = {}  # step -> why it has none
    if ns.advantages and (ns.show is not None or ns.html):
        if rn.run_dir is None:
            raise ConfigError("--advantages needs a run directory (config.json names the run's estimator)")
        advantages = {}
        for step in sorted({t.meta.step for t in trajs if t.meta.step is not None}):
            sa = advantages_of_step(rn, step, device=ns.device, dtype=ns.dtype, tokenizer=tokenizer())
            advantages.update(sa.values)
            adv_source.update(dict.fromkeys(sa.values, sa.source))
            if sa.error is not None:
                no_adv[step] = sa.error
                adv_notes.append(f"step {step}: NO ADVANTAGES: {sa.error}")
            elif sa.from_record:
                adv_notes.append(f"step {step}: advantages {sa.source}")
        out["advantages"] = {"notes": adv_notes}
        for note in adv_notes:
            emit.append(lambda note=note: print(f"note: {note}"))  # type: ignore[misc]

    recomputed: replay.RecomputeReport | None = None
    if ns.recompute and trajs:
        if ns.model is not None:
            recomputed = recompute(
                trajs,
                ns.model,
                tokenizer=tokenizer(),
                temperature=train_config(rn).learner.temperature if rn.run_dir is not None else 1.0,
                indices=indices,
                top=ns.top,
                device=ns.device,
                dtype=ns.dtype,
            )
        else:
            recomputed = recompute_run(
                rn, indices=indices, tokenizer=tokenizer(), top=ns.top, device=ns.device, dtype=ns.dtype
            )
        rep_c = recomputed
        out["recompute"] = {k: v for k, v in _jsonable(rep_c).items() if k != "trajectories"}
        out["recompute"]["per_trajectory"] = [
            {
                "index": t.index,
                "episode_id": t.episode_id,
                "weights": t.weights,
                "max_abs_diff": t.max_abs_diff,
                "mean_abs_diff": t.mean_abs_diff,
                "worst_token": t.worst_token,
            }
            for t in rep_c.trajectories
        ]
        emit.append(lambda: print_recompute(rep_c))
        if ns.max_diff is not None and rep_c.max_abs_diff > ns.max_diff:
            rc = 1

    if ns.check:
        reports = [replay.check(rn.trajectories[i], tokenizer(), index=i) for i in indices]
        out["check"] = _jsonable(reports)
        emit.append(lambda: _print_check(reports))
        if any(not r.ok for r in reports):
            rc = 1

    if ns.reexec or ns.rescore:
        # The run's settings are read only by the modes that need one: listing works on any config.json.
        if ns.env_kwargs:
            try:
                env_kwargs = json.loads(ns.env_kwargs)
            except json.JSONDecodeError as e:
                raise ConfigError(f"--env-kwargs is not JSON: {e}") from e
        else:
            # An agent run's --env is only its task source (maybe a .jsonl file): nothing is re-executed.
            run_cfg = train_config(rn) if rn.run_dir is not None else None
            env_kwargs = env_arguments(run_cfg) if run_cfg is not None and run_cfg.agent is None else {}
        if not isinstance(env_kwargs, dict):
            raise ConfigError("--env-kwargs must be a JSON object")
        env_kwargs = rejudge_env_kwargs(env_kwargs, ns)
        needs_tok = any(not t.actions for t in trajs)
        rex = asyncio.run(
            areexec_many(
                trajs,
                indices=indices,
                concurrency=ns.concurrency,
                env_kwargs=env_kwargs,
                tokenizer=tokenizer() if needs_tok else None,
                pool=rn.trajectories,  # a later sample is re-executed after its episode's earlier ones
            )
        )
        if ns.reexec:
            out["reexec"] = _jsonable(rex)
            emit.append(lambda: _print_reexec(rex))
            rc = 1 if rc == 1 else reexec_status(rex)
        if ns.rescore:
            resc = [RescoreReport.from_reexec(r, t) for r, t in zip(rex, trajs, strict=True)]
            resc = add_group_terms(resc, trajs, rn.trajectories, env_kwargs)  # --reward.relative-judge
            out["rescore"] = _jsonable(resc)
            emit.append(lambda: _print_rescore(resc))
            if any(not r.matches and not r.not_reexecutable for r in resc):
                rc = 1
            elif rc == 0 and any(r.not_reexecutable for r in resc):
                rc = 3
        if rn.run_dir is None and not ns.env_kwargs and any(not r.ok and not r.not_reexecutable for r in rex):
            # A bare trajectories file records the env's id, not the arguments it was built with.
            emit.append(lambda: print(NO_ENV_KWARGS))

    if ns.show is not None:
        k = ns.show
        t = rn.trajectories[k]
        adv = advantages.get(k) if advantages is not None else None
        if ns.advantages and adv is None and t.meta.step in no_adv:
            print(f"note: trajectory {k}: no advantages: {no_adv[t.meta.step]}")
        elif ns.advantages and adv is None:
            print(f"note: trajectory {k} was not trained on (no step or infra failure): no advantages")
        elif ns.advantages and k in adv_source:
            print(f"note: trajectory {k}: advantages {adv_source[k]}")
        rc_t = recomputed.trajectories[0] if recomputed is not None else None
        text = replay.render(
            t,
            tokenizer=tokenizer(),
            index=k,
            color=_color(ns.color),
            tokens=ns.tokens,
            advantages=adv,
            recomputed=rc_t,
        )
        out["show"] = {"index": k, "trajectory": t.to_dict(), "advantages": adv}
        emit.insert(0, lambda: print(text))

    if ns.html:
        path = replay.write_html(
            rn,
            ns.html,
            tokenizer=tokenizer(),
            indices=indices,
            advantages=advantages,
            recomputed=recomputed,
            advantage_sources=adv_source,
            notes=adv_notes,
        )
        out["html"] = str(path)
        emit.append(lambda: print(f"wrote {path} ({len(indices)} trajectories)"))

    if listing and ns.step is not None and not ns.no_reproduce:
        if rn.run_dir is None:
            emit.append(lambda: print("note: not a run directory, so step reproduction is not possible"))
        else:
            rep_s = reproduce_step(
                rn,
                ns.step,
                device=ns.device,
                dtype=ns.dtype,
                rtol=ns.rtol,
                atol=ns.atol,
                tokenizer=tokenizer(),
            )
            out["step"] = _jsonable(
                {k: v for k, v in dataclasses.asdict(rep_s).items() if k != "advantages"}
                | {"matches": rep_s.matches}
            )
            emit.append(lambda: print_step(rep_s))
            if not rep_s.matches:
                rc = 1

    try:
        if ns.json:
            print(json.dumps(_jsonable(out), default=str))
        else:
            for fn in emit:
                fn()
        sys.stdout.flush()
    except BrokenPipeError:  # `agentrl replay RUN | head`: the reader left; not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return rc
