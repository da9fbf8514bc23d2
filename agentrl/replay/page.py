# ruff: noqa: E501  (the embedded CSS and JavaScript keep their natural line lengths)
"""The self-contained HTML viewer of ``agentrl replay --html``: one static page, no network assets.

:func:`render_page` takes the JSON-ready payload built by :func:`agentrl.replay.write_html` and returns the
page: inline CSS, inline JavaScript, and the data as a ``<script type="application/json">`` block. The
script builds every element with DOM calls and ``textContent`` (model and tool text is never parsed as
HTML), so a trajectory that contains ``</script>`` or markup renders as text.

Element ids the browser test relies on: ``#filters`` (``#q``, ``#f-step``, ``#f-stop``, ``#f-tool``,
``#f-min``, ``#f-max``, ``#f-err``), ``#count``, ``#list`` (rows ``tr[data-i]``), ``#detail`` (``#d-title``,
``#d-meta``), the tabs ``#tab-transcript``/``#tab-tools``/``#tab-tokens`` and their panes ``#transcript``,
``#tools``, ``#tokens``, the colour selector ``#color-by``, the token stream ``#stream`` (``span.tok`` with
``data-k``), the hover tooltip ``#tip`` and the pinned details ``#tok-info``.
"""

from __future__ import annotations

import html
import json
import re
from typing import Any

__all__ = ["render_page"]


def _json_for_script(payload: Any) -> str:
    # Inside <script>, only "</" (and "<!--") can end or confuse the element; escape every "<" to be safe.
    text = json.dumps(payload, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    return text.replace("<", "\\u003c").replace("\u2028", "\\u2028").replace("\u2029", "\\u2029")


def render_page(payload: dict[str, Any]) -> str:
    """The whole page for ``payload`` (see :func:`agentrl.replay.write_html`)."""
    parts = {
        "TITLE": html.escape(str(payload.get("title", "agentrl replay"))),
        "CSS": _CSS,
        "JS": _JS,
        "DATA": _json_for_script(payload),
    }
    # One pass, so text inserted for one placeholder is never scanned for another.
    return re.sub(r"%%(TITLE|CSS|JS|DATA)%%", lambda m: parts[m.group(1)], _PAGE)


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta http-equiv="Content-Security-Policy" content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src data:">
<title>%%TITLE%%</title>
<style>%%CSS%%</style>
</head>
<body>
<header>
  <h1 id="title">%%TITLE%%</h1>
  <div id="notes"></div>
</header>
<main>
<section id="left">
  <form id="filters" autocomplete="off" onsubmit="return false">
    <input id="q" type="search" placeholder="search text, tool output, errors">
    <label>step <select id="f-step"><option value="">any</option></select></label>
    <label>stop <select id="f-stop"><option value="">any</option></select></label>
    <label>tool <select id="f-tool"><option value="">any</option></select></label>
    <label>reward &ge; <input id="f-min" type="number" step="any"></label>
    <label>&le; <input id="f-max" type="number" step="any"></label>
    <label><input id="f-err" type="checkbox"> errors only</label>
  </form>
  <div id="count"></div>
  <div id="list-wrap">
  <table id="list">
    <thead><tr><th>#</th><th>step</th><th>group</th><th>reward</th><th>stop</th><th>turns</th>
    <th>tok</th><th>tools</th></tr></thead>
    <tbody></tbody>
  </table>
  </div>
</section>
<section id="detail">
  <p id="empty">Pick a trajectory on the left.</p>
  <div id="d-body" hidden>
    <h2 id="d-title"></h2>
    <dl id="d-meta"></dl>
    <div id="d-errors"></div>
    <nav id="tabs">
      <button id="tab-transcript" class="tab active" data-pane="transcript">Transcript</button>
      <button id="tab-tools" class="tab" data-pane="tools">Tool calls</button>
      <button id="tab-tokens" class="tab" data-pane="tokens">Tokens</button>
    </nav>
    <div id="transcript" class="pane"></div>
    <div id="tools" class="pane" hidden></div>
    <div id="tokens" class="pane" hidden>
      <div id="tok-controls">
        <label>colour by
          <select id="color-by">
            <option value="source">provenance / mask</option>
            <option value="logprob">log-prob</option>
            <option value="advantage">advantage</option>
            <option value="recomputed">|recorded &minus; recomputed| log-prob</option>
          </select>
        </label>
        <span id="legend"></span>
      </div>
      <div id="tok-info">Hover a token for details; click to pin.</div>
      <div id="stream"></div>
    </div>
  </div>
</section>
</main>
<div id="tip" hidden></div>
<script id="data" type="application/json">%%DATA%%</script>
<script>%%JS%%</script>
</body>
</html>
"""

_CSS = """
:root { --prompt:#e5e7eb; --model:#bbf7d0; --observation:#bae6fd; --template:#f5d0fe; --bad:#fecaca; }
* { box-sizing: border-box; }
body { margin: 0; font: 13px/1.4 system-ui, sans-serif; color: #111827; background: #fff; }
header { padding: 6px 12px; border-bottom: 1px solid #d1d5db; background: #f9fafb; }
h1 { font-size: 15px; margin: 0; }
#notes { color: #92400e; }
main { display: flex; height: calc(100vh - 40px); }
#left { width: 42%; min-width: 320px; border-right: 1px solid #d1d5db; display: flex; flex-direction: column; }
#filters { padding: 6px; display: flex; flex-wrap: wrap; gap: 4px 10px; border-bottom: 1px solid #e5e7eb; }
#filters input[type=search] { width: 100%; padding: 3px; }
#filters input[type=number] { width: 60px; }
#count { padding: 2px 8px; color: #4b5563; }
#list-wrap { overflow: auto; flex: 1; }
#list { border-collapse: collapse; width: 100%; }
#list th, #list td { padding: 2px 6px; text-align: left; border-bottom: 1px solid #f3f4f6; white-space: nowrap; }
#list th { position: sticky; top: 0; background: #f9fafb; }
#list tbody tr { cursor: pointer; }
#list tbody tr:hover { background: #f3f4f6; }
#list tbody tr.sel { background: #dbeafe; }
#list td.r1 { color: #166534; font-weight: 600; }
.st-bad { color: #b91c1c; }
#detail { flex: 1; overflow: auto; padding: 8px 14px; }
#d-title { font-size: 15px; margin: 2px 0 6px; }
#d-meta { display: grid; grid-template-columns: max-content 1fr; gap: 1px 10px; margin: 0 0 6px; }
#d-meta dt { color: #6b7280; } #d-meta dd { margin: 0; font-family: ui-monospace, monospace; }
#d-errors .err { background: var(--bad); padding: 4px 6px; margin: 2px 0; border-radius: 3px; }
#tabs { margin: 8px 0; border-bottom: 1px solid #d1d5db; }
.tab { border: 1px solid #d1d5db; border-bottom: none; background: #f9fafb; padding: 4px 10px; cursor: pointer; }
.tab.active { background: #fff; font-weight: 600; }
.msg { border: 1px solid #e5e7eb; border-left: 4px solid #9ca3af; margin: 6px 0; border-radius: 3px; }
.msg.role-assistant { border-left-color: #16a34a; }
.msg.role-tool { border-left-color: #0284c7; }
.msg.role-user { border-left-color: #9333ea; }
.msg.prompt { opacity: .75; }
.msg-h { background: #f9fafb; padding: 2px 6px; color: #374151; font-size: 12px; }
pre { margin: 0; padding: 4px 6px; white-space: pre-wrap; word-break: break-word;
      font: 12px/1.35 ui-monospace, SFMono-Regular, Menlo, monospace; }
.call { margin: 2px 6px 4px; padding: 2px 6px; background: #fefce8; border-radius: 3px; }
.badge { display: inline-block; padding: 0 5px; border-radius: 8px; font-size: 11px; background: #dcfce7; }
.badge.bad { background: var(--bad); }
table.calls { border-collapse: collapse; width: 100%; }
table.calls td, table.calls th { border: 1px solid #e5e7eb; padding: 3px; vertical-align: top; text-align: left; }
#tok-controls { margin-bottom: 4px; }
#legend span { padding: 0 6px; margin-left: 6px; border-radius: 3px; }
#tok-info { font-family: ui-monospace, monospace; font-size: 12px; background: #f9fafb; border: 1px solid #e5e7eb;
            padding: 4px 6px; margin-bottom: 6px; height: 7.4em; overflow: auto; white-space: pre-wrap; }
#stream { font: 12px/1.6 ui-monospace, SFMono-Regular, Menlo, monospace; white-space: pre-wrap; word-break: break-all; }
.tok { border-radius: 2px; cursor: default; }
.tok.m1 { box-shadow: inset 0 -2px 0 #15803d; }
.tok.pin { outline: 2px solid #1d4ed8; }
.tok:hover { outline: 1px solid #111827; }
#tip { position: fixed; z-index: 10; max-width: 420px; background: #111827; color: #f9fafb; padding: 5px 7px;
       border-radius: 4px; font: 12px/1.35 ui-monospace, monospace; white-space: pre-wrap; pointer-events: none; }
"""

_JS = r"""
"use strict";
const DATA = JSON.parse(document.getElementById("data").textContent);
const TRAJ = DATA.trajectories;
const BY_I = new Map(TRAJ.map(t => [t.i, t]));
const SRC_COLOR = {prompt: "var(--prompt)", model: "var(--model)", observation: "var(--observation)",
                   template: "var(--template)"};
const $ = id => document.getElementById(id);
let current = null;
let pinned = null;

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "text") e.textContent = v;
    else if (k === "cls") e.className = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const k of kids) if (k !== null && k !== undefined) e.append(k);
  return e;
}
function fmt(x, d) { return (x === null || x === undefined) ? "-" : Number(x).toFixed(d === undefined ? 4 : d); }
function tokText(id) { const s = DATA.vocab[String(id)]; return s === undefined ? "\u27e8" + id + "\u27e9" : s; }
function toolSummary(t) {
  const c = {};
  for (const r of t.tools) c[r.status] = (c[r.status] || 0) + 1;
  return Object.entries(c).map(([k, v]) => v + " " + k).join(", ");
}
function hasErrors(t) { return t.errors.length > 0 || t.infra || t.tools.some(r => r.status !== "ok"); }
function haystack(t) {
  if (t._hay === undefined) {
    const parts = [];
    for (const m of t.messages) {
      parts.push(m.content || "");
      for (const c of (m.tool_calls || [])) parts.push(c.function.arguments);
    }
    for (const r of t.tools) parts.push(r.name, r.arguments, r.output, r.detail);
    for (const e of t.errors) parts.push(e.message);
    parts.push(...t.actions, t.id, t.task);
    t._hay = parts.join("\n").toLowerCase();
  }
  return t._hay;
}

function fillSelect(sel, values) {
  for (const v of values) sel.append(el("option", {value: v, text: v}));
}
function setupFilters() {
  fillSelect($("f-step"), [...new Set(TRAJ.map(t => t.step).filter(s => s !== null))].sort((a, b) => a - b));
  fillSelect($("f-stop"), [...new Set(TRAJ.map(t => t.stop))].sort());
  fillSelect($("f-tool"), [...new Set(TRAJ.flatMap(t => t.tools.map(r => r.status)))].sort());
  for (const id of ["q", "f-step", "f-stop", "f-tool", "f-min", "f-max", "f-err"]) {
    $(id).addEventListener("input", applyFilters);
    $(id).addEventListener("change", applyFilters);
  }
}
function applyFilters() {
  const q = $("q").value.trim().toLowerCase();
  const step = $("f-step").value, stop = $("f-stop").value, tool = $("f-tool").value;
  const mn = $("f-min").value === "" ? null : Number($("f-min").value);
  const mx = $("f-max").value === "" ? null : Number($("f-max").value);
  const errOnly = $("f-err").checked;
  const rows = TRAJ.filter(t =>
    (step === "" || String(t.step) === step) && (stop === "" || t.stop === stop) &&
    (tool === "" || t.tools.some(r => r.status === tool)) &&
    (mn === null || t.reward >= mn) && (mx === null || t.reward <= mx) &&
    (!errOnly || hasErrors(t)) && (q === "" || haystack(t).includes(q)));
  const body = $("list").tBodies[0];
  body.replaceChildren();
  for (const t of rows) {
    const tr = el("tr", {"data-i": t.i},
      el("td", {text: t.ep ? t.i + " \u00b7 " + (t.ep.sample + 1) + "/" + t.ep.samples : t.i,
                title: t.ep ? "sample " + t.ep.sample + " of a " + t.ep.samples + "-sample episode" : null}),
      el("td", {text: t.step === null ? "-" : t.step}),
      el("td", {text: (t.group || "").slice(0, 8), title: t.group}),
      el("td", {text: fmt(t.reward, 2), cls: t.reward > 0 ? "r1" : ""}),
      el("td", {text: t.stop, cls: t.infra ? "st-bad" : ""}), el("td", {text: t.turns}),
      el("td", {text: t.model_tokens}), el("td", {text: toolSummary(t), cls: hasErrors(t) ? "st-bad" : ""}));
    if (current && current.i === t.i) tr.classList.add("sel");
    tr.addEventListener("click", () => show(t.i));
    body.append(tr);
  }
  $("count").textContent = rows.length + " of " + TRAJ.length + " trajectories";
}

function show(i) {
  const t = BY_I.get(i);
  if (!t) return;
  current = t;
  pinned = null;
  for (const tr of $("list").tBodies[0].rows) tr.classList.toggle("sel", tr.dataset.i === String(i));
  if (location.hash !== "#t" + i) history.replaceState(null, "", "#t" + i);
  $("empty").hidden = true;
  $("d-body").hidden = false;
  $("d-title").textContent = "trajectory " + t.i + " \u00b7 reward " + fmt(t.reward, 3) + " \u00b7 " + t.stop;
  const meta = $("d-meta");
  meta.replaceChildren();
  const rows = [["episode", t.id], ["env", t.env], ["task", t.task], ["seed", t.seed], ["step", t.step],
    ["group", t.group], ...(t.session ? [["gateway", t.session]] : []), ["policy version", t.pv], ["rewards per step", t.rewards.join(", ") || "none"],
    ...(t.ran ? [["ran on", t.ran]] : []),
    ["terminated / truncated", t.terminated + " / " + t.truncated], ["turns", t.turns],
    ["tokens", t.ids.length + " (" + t.model_tokens + " sampled)"]];
  if (t.adv_src) rows.push(["advantages", t.adv_src]);
  for (const [k, v] of rows) meta.append(el("dt", {text: k}), el("dd", {text: v === null ? "-" : String(v)}));
  if (t.ep) renderEpisode(t, meta);
  const errs = $("d-errors");
  errs.replaceChildren();
  for (const e of t.errors)
    errs.append(el("div", {cls: "err", text: e.kind + " (turn " + e.turn + (e.infra ? ", infra" : "") + "): " + e.message}));
  renderTranscript(t);
  renderTools(t);
  renderTokens(t);
}

// A multi-sample episode (compacted context, sub-agents): this sample and links to its siblings.
function renderEpisode(t, meta) {
  const dd = el("dd", {id: "d-samples"});
  for (const [k, j] of t.ep.links) {
    const here = k === t.ep.sample;
    const b = el("button", {cls: "ep-link" + (here ? " sel" : ""), "data-j": j === null ? null : j,
      disabled: j === null || here, text: "sample " + k + (j === null ? " (not on this page)" : "")});
    if (j !== null && !here) b.addEventListener("click", () => show(j));
    dd.append(b, " ");
  }
  meta.append(el("dt", {text: "episode samples"}), dd,
    el("dt", {text: "episode return"}), el("dd", {text: t.ep.return === null ? "- (a sample is missing)" : fmt(t.ep.return, 3)}));
}
function modelSegments(t) { return t.segments.filter(s => s[0] === "model"); }
function renderTranscript(t) {
  const pane = $("transcript");
  pane.replaceChildren();
  const segByMsg = new Map(modelSegments(t).filter(s => s[4] !== null).map(s => [s[4], s]));
  const firstModel = [...segByMsg.keys()].reduce((a, b) => Math.min(a, b), t.messages.length);
  const rec = new Map(t.tools.map(r => [r.call_id, r]));
  t.messages.forEach((m, k) => {
    let head = "[" + k + "] " + m.role;
    const seg = segByMsg.get(k);
    if (seg) head += " \u00b7 turn " + seg[3] + " \u00b7 " + (seg[2] - seg[1]) + " tokens";
    else if (k < firstModel) head += " \u00b7 prompt";
    const box = el("div", {cls: "msg role-" + m.role + (k < firstModel ? " prompt" : ""), "data-m": k});
    const h = el("div", {cls: "msg-h", text: head});
    const r = (m.role === "tool" && k > firstModel) ? rec.get(m.tool_call_id) : null;
    if (r) h.append(" \u00b7 ", el("span", {cls: "badge" + (r.status === "ok" ? "" : " bad"), text: r.name + " " + r.status}),
                    " " + fmt(r.duration_s, 2) + "s");
    box.append(h, el("pre", {text: m.content}));
    for (const c of (m.tool_calls || [])) {
      const rr = rec.get(c.id);
      box.append(el("div", {cls: "call", text: "\u21b3 call " + c.id + ": " + c.function.name + "(" +
        c.function.arguments + ") \u2192 " + (rr ? rr.status : "not run")}));
    }
    pane.append(box);
  });
}

function renderTools(t) {
  const pane = $("tools");
  pane.replaceChildren();
  if (!t.tools.length) { pane.append(el("p", {text: "No tool calls."})); return; }
  const tb = el("tbody");
  for (const r of t.tools) {
    tb.append(el("tr", {"data-call": r.call_id},
      el("td", {text: r.call_id}), el("td", {text: r.turn}), el("td", {text: r.name}),
      el("td", {}, el("span", {cls: "badge" + (r.status === "ok" ? "" : " bad"), text: r.status})),
      el("td", {text: fmt(r.duration_s, 3)}),
      el("td", {}, el("pre", {text: r.arguments})), el("td", {}, el("pre", {text: r.output})),
      el("td", {}, el("pre", {text: r.detail}))));
  }
  pane.append(el("table", {cls: "calls"},
    el("thead", {}, el("tr", {}, ...["call", "turn", "tool", "status", "s", "arguments", "output", "detail"]
      .map(x => el("th", {text: x})))), tb));
}

function heat(v, lo, hi, hue) {
  // v in [lo, hi] -> light to saturated colour of one hue
  const f = hi > lo ? Math.max(0, Math.min(1, (v - lo) / (hi - lo))) : 0;
  return "hsl(" + hue + ", 85%, " + (96 - 46 * f).toFixed(1) + "%)";
}
function tokenColor(t, k, mode) {
  const src = t._src[k];
  if (mode === "source") return SRC_COLOR[src];
  if (t.mask[k] !== 1) return "transparent";
  if (mode === "logprob") return t.lp[k] === null ? "transparent" : heat(-t.lp[k], 0, 10, 0);
  if (mode === "advantage") {
    if (!t.adv || t.adv[k] === null) return "transparent";
    const a = t.adv[k], m = t._advMax || 1;
    return a >= 0 ? heat(a, 0, m, 140) : heat(-a, 0, m, 0);
  }
  if (mode === "recomputed") {
    if (!t.rlp || t.rlp[k] === null || t.lp[k] === null) return "transparent";
    return heat(Math.log10(Math.abs(t.lp[k] - t.rlp[k]) + 1e-9), -7, 0, 30);
  }
  return "transparent";
}
function legend(mode) {
  const L = $("legend");
  L.replaceChildren();
  const items = {source: [["prompt", "var(--prompt)"], ["model (mask 1)", "var(--model)"],
                          ["observation", "var(--observation)"], ["template", "var(--template)"]],
    logprob: [["log p \u2248 0", heat(0, 0, 10, 0)], ["log p = -5", heat(5, 0, 10, 0)], ["log p \u2264 -10", heat(10, 0, 10, 0)]],
    advantage: [["negative", heat(1, 0, 1, 0)], ["0", heat(0, 0, 1, 0)], ["positive", heat(1, 0, 1, 140)]],
    recomputed: [["|diff| \u2264 1e-7", heat(-7, -7, 0, 30)], ["1e-3", heat(-3, -7, 0, 30)], ["\u2265 1", heat(0, -7, 0, 30)]]}[mode];
  for (const [name, c] of items) { const s = el("span", {text: name}); s.style.background = c; L.append(s); }
}
function renderTokens(t) {
  if (!t._src) {
    t._src = new Array(t.ids.length).fill("prompt");
    t._turn = new Array(t.ids.length).fill(-1);
    for (const s of t.segments) for (let k = s[1]; k < s[2]; k++) { t._src[k] = s[0]; t._turn[k] = s[3]; }
    t._advMax = t.adv ? t.adv.reduce((m, a) => a === null ? m : Math.max(m, Math.abs(a)), 1e-9) : 1;
  }
  const sel = $("color-by");
  sel.querySelector('option[value="advantage"]').disabled = !t.adv;
  sel.querySelector('option[value="recomputed"]').disabled = !t.rlp;
  if (sel.selectedOptions[0].disabled) sel.value = "source";
  const mode = sel.value;
  legend(mode);
  const box = $("stream");
  const frag = document.createDocumentFragment();
  for (let k = 0; k < t.ids.length; k++) {
    const span = el("span", {cls: "tok" + (t.mask[k] === 1 ? " m1" : ""), "data-k": k, text: tokText(t.ids[k])});
    span.style.background = tokenColor(t, k, mode);
    frag.append(span);
  }
  box.replaceChildren(frag);
  $("tok-info").textContent = "Hover a token for details; click to pin.";
}
function tokenDetails(t, k) {
  const lines = ["token " + k + "  id " + t.ids[k] + "  " + JSON.stringify(tokText(t.ids[k])),
    "source " + t._src[k] + "  turn " + t._turn[k] + "  mask " + t.mask[k],
    "log-prob " + fmt(t.lp[k]) + (t.lp[k] !== null ? "  (p = " + Math.exp(t.lp[k]).toPrecision(3) + ")" : "")];
  if (t.adv) lines.push("advantage " + fmt(t.adv[k]));
  if (t.rlp) lines.push("recomputed " + fmt(t.rlp[k]) + "  |diff| " +
    (t.rlp[k] !== null && t.lp[k] !== null ? Math.abs(t.lp[k] - t.rlp[k]).toExponential(2) : "-") +
    "  \u03a3\u03c0\u00b2 " + (t.spi2 && t.spi2[k] !== null ? Number(t.spi2[k]).toPrecision(4) : "-"));
  return lines.join("\n");
}
function setupTokens() {
  const box = $("stream"), tip = $("tip");
  box.addEventListener("mouseover", ev => {
    const s = ev.target.closest(".tok");
    if (!s || !current) return;
    const text = tokenDetails(current, Number(s.dataset.k));
    tip.textContent = text;
    tip.hidden = false;
    if (pinned === null) $("tok-info").textContent = text;
  });
  box.addEventListener("mousemove", ev => {
    tip.style.left = Math.min(ev.clientX + 14, window.innerWidth - 430) + "px";
    tip.style.top = (ev.clientY + 16) + "px";
  });
  box.addEventListener("mouseleave", () => { tip.hidden = true; });
  box.addEventListener("click", ev => {
    const s = ev.target.closest(".tok");
    if (!s || !current) return;
    for (const p of box.querySelectorAll(".tok.pin")) p.classList.remove("pin");
    pinned = Number(s.dataset.k);
    s.classList.add("pin");
    $("tok-info").textContent = tokenDetails(current, pinned);
  });
  $("color-by").addEventListener("change", () => { if (current) renderTokens(current); });
}
function setupTabs() {
  for (const b of document.querySelectorAll(".tab")) {
    b.addEventListener("click", () => {
      for (const o of document.querySelectorAll(".tab")) o.classList.toggle("active", o === b);
      for (const p of document.querySelectorAll(".pane")) p.hidden = p.id !== b.dataset.pane;
    });
  }
}

$("notes").textContent = DATA.notes.join("; ");
setupFilters();
setupTabs();
setupTokens();
applyFilters();
function fromHash() {
  const m = /^#t(\d+)$/.exec(location.hash);
  if (m && (!current || current.i !== Number(m[1]))) show(Number(m[1]));
}
window.addEventListener("hashchange", fromHash);
fromHash();
document.body.dataset.ready = "1";
"""
