// memrl view: the page. Plain DOM, no build step, no network beyond this server's JSON API.
"use strict";

const PAGE = 50;
const state = { runs: [], run: 0, offset: 0, total: 0, idx: null, key: null, summaries: {} };
const KNOWN = new Set(["kind", "chunk", "chunk_chars", "chunk_index", "chunk_tokens", "memory", "previous_memory",
  "response_text", "recall_query", "recalled_memory", "recalled_step", "recall_score", "recall_hit",
  "shown_recalled_memory", "tool_calls", "tool_results", "prunes", "context_tokens", "prediction",
  "action", "retrievals", "calls_well_formed", "memory_shown", "retrieved", "memory_finished",
  "internal_state", "query", "observation", "turn",
  "description", "prompt", "returned", "end", "queries", "summary", "part", "thread", "branch_turns", "turn_spans",
  "dropped"]);

function el(tag, attrs, ...kids) {
  const n = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") n.className = v;
    else if (k.startsWith("on")) n.addEventListener(k.slice(2), v);
    else n.setAttribute(k, v);
  }
  for (const c of kids.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    n.append(c instanceof Node ? c : String(c));
  }
  return n;
}

function svg(tag, attrs, ...kids) {
  const n = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, v);
  for (const c of kids.flat(Infinity)) if (c !== null && c !== undefined) n.append(c instanceof Node ? c : String(c));
  return n;
}

function showError(msg) {
  const e = document.getElementById("error");
  e.textContent = msg;
  e.hidden = false;
}

async function api(path) {
  let r;
  try {
    r = await fetch("/api/" + path);
  } catch (e) {
    throw new Error(`/api/${path}: server unreachable (${e.message})`);
  }
  let body;
  try {
    body = await r.json();
  } catch (e) {
    throw new Error(`/api/${path}: HTTP ${r.status}, not JSON`);
  }
  if (!r.ok) throw new Error(body.error || `/api/${path}: HTTP ${r.status}`);
  return body;
}

const fmt = (x, d = 3) => (x === null || x === undefined) ? "–" : (typeof x === "number" ? +x.toFixed(d) : x);
const json = (v) => typeof v === "string" ? v : JSON.stringify(v, null, 1);

// ------------------------------------------------------------------ charts (inline SVG)

function lineChart(points, opts) {
  // points: [[x, y], ...]; opts: {w, h, ymin, ymax, xcat (categorical x), label}
  const w = opts.w || 320, h = opts.h || 120, pad = 28;
  const g = svg("svg", { width: w, height: h, class: opts.cls || "chart", viewBox: `0 0 ${w} ${h}` });
  if (!points.length) { g.append(svg("text", { x: 10, y: h / 2 }, "no data")); return g; }
  const ys = points.map(p => p[1]);
  const ymin = opts.ymin ?? Math.min(...ys), ymax = opts.ymax ?? Math.max(...ys);
  const span = (ymax - ymin) || 1;
  const X = opts.xcat ? (i) => pad + (points.length === 1 ? (w - pad - 8) / 2 : i * (w - pad - 8) / (points.length - 1))
    : (() => { const xs = points.map(p => p[0]); const a = Math.min(...xs), b = Math.max(...xs) || 1;
      return (i) => pad + ((points[i][0] - a) / ((b - a) || 1)) * (w - pad - 8); })();
  const Y = (y) => h - 16 - ((y - ymin) / span) * (h - 26);
  g.append(svg("line", { x1: pad, y1: h - 16, x2: w - 4, y2: h - 16, stroke: "#c9ced8" }));
  g.append(svg("text", { x: 2, y: Y(ymax) + 4 }, fmt(ymax, 2)), svg("text", { x: 2, y: Y(ymin) }, fmt(ymin, 2)));
  const d = points.map((p, i) => `${i ? "L" : "M"}${X(i).toFixed(1)},${Y(p[1]).toFixed(1)}`).join("");
  g.append(svg("path", { d, fill: "none", stroke: "#4f7cff", "stroke-width": 1.6 }));
  points.forEach((p, i) => {
    if (opts.xcat || points.length <= 40) {
      g.append(svg("circle", { cx: X(i), cy: Y(p[1]), r: 2.6, fill: "#4f7cff" },
        svg("title", {}, `${opts.xlabel || "x"}=${p[0]}: ${fmt(p[1], 3)}`)));
    }
    if (opts.xcat) g.append(svg("text", { x: X(i) - 4, y: h - 4 }, p[0]), svg("text", { x: X(i) - 8, y: Y(p[1]) - 6 }, fmt(p[1], 1)));
  });
  if (!opts.xcat) {
    g.append(svg("text", { x: pad, y: h - 4 }, points[0][0]), svg("text", { x: w - 30, y: h - 4 }, points[points.length - 1][0]));
  }
  return g;
}

function barChart(values, label) {
  const w = 320, h = 46, n = values.length || 1, bw = Math.max(1, (w - 30) / n - 1);
  const max = Math.max(1, ...values);
  const g = svg("svg", { width: w, height: h, class: "ctxchart" });
  values.forEach((v, i) => g.append(svg("rect", { x: 28 + i * (bw + 1), y: h - 4 - (v / max) * (h - 10), width: bw,
    height: (v / max) * (h - 10), fill: "#8aa4ff" }, svg("title", {}, `call ${i}: ${v} ${label}`))));
  g.append(svg("text", { x: 0, y: 12 }, max));
  return g;
}

// ------------------------------------------------------------------ runs, summary, list

async function init() {
  try {
    state.runs = await api("runs");
  } catch (e) { showError(e.message); return; }
  const nav = document.getElementById("runs");
  state.runs.forEach((r, i) => nav.append(el("button", { id: `run-${i}`, onclick: () => selectRun(i) },
    `${i === 0 ? "A" : "B"}: ${r.name}`)));
  for (const id of ["correct", "length", "workflow"]) {
    document.getElementById(id).addEventListener("change", () => { state.offset = 0; loadList(); });
  }
  let timer = null;
  document.getElementById("q").addEventListener("input", () => {
    clearTimeout(timer); timer = setTimeout(() => { state.offset = 0; loadList(); }, 200);
  });
  document.getElementById("prev").onclick = () => { state.offset = Math.max(0, state.offset - PAGE); loadList(); };
  document.getElementById("next").onclick = () => {
    if (state.offset + PAGE < state.total) { state.offset += PAGE; loadList(); }
  };
  const h = new URLSearchParams(location.hash.slice(1));
  await selectRun(+(h.get("run") || 0));
  if (h.get("idx") !== null) openRow(+h.get("idx"));
  window.addEventListener("hashchange", async () => {  // links, back / forward
    const h = new URLSearchParams(location.hash.slice(1));
    const run = +(h.get("run") || 0), idx = h.get("idx") === null ? null : +h.get("idx");
    if (run !== state.run) await selectRun(run);
    if (idx !== null && (idx !== state.idx || run !== state.shown)) openRow(idx);
  });
}

async function selectRun(i) {
  state.run = i; state.offset = 0;
  document.querySelectorAll("nav button").forEach((b, j) => b.classList.toggle("on", i === j));
  await Promise.all([loadSummary(), loadList()]);
}

async function loadSummary() {
  const box = document.getElementById("summary");
  box.replaceChildren(el("p", { class: "hint" }, "loading…"));
  let s;
  try { s = await api(`runs/${state.run}/summary`); } catch (e) { box.replaceChildren(el("div", { class: "error" }, e.message)); return; }
  state.summaries[state.run] = s;
  const kids = [el("h2", {}, `${s.name} `, el("span", { class: "meta" }, `${s.kind} · ${s.workflow || ""} · ${s.rows} rows`)),
    el("div", { class: "meta" }, s.path)];
  for (const w of s.warnings) kids.push(el("div", { class: "warn" }, w));
  if (s.accuracy_by_length.length) {
    const lab = s.kind === "eval" ? "documents" : "chunks";
    kids.push(el("div", { class: "label" }, `${s.kind === "eval" ? "accuracy (sub-EM, %)" : "reward > 0 (%)"} by ${lab}`),
      lineChart(s.accuracy_by_length.map(a => [a.length, a.accuracy]), { ymin: 0, ymax: 100, xcat: true, xlabel: lab, cls: "acc" }));
    if (s.has_plot) kids.push(el("a", { href: `/api/runs/${state.run}/plot.png`, target: "_blank" }, "eval report plot (PNG)"));
  }
  if (s.metric_names.length) {
    const pick = el("select", { id: "metric" }, s.metric_names.map(n => el("option", { value: n }, n)));
    const pref = ["reward/mean", "reward/accuracy", "loss/total"].find(n => s.metric_names.includes(n)) || s.metric_names[0];
    pick.value = pref;
    const holder = el("div", { id: "curve" });
    const draw = async () => {
      try {
        const m = await api(`runs/${state.run}/metrics?names=${encodeURIComponent(pick.value)}`);
        holder.replaceChildren(lineChart(m[pick.value] || [], { xlabel: "step", cls: "curve" }));
      } catch (e) { holder.replaceChildren(el("div", { class: "error" }, e.message)); }
    };
    pick.addEventListener("change", draw);
    kids.push(el("div", { class: "label" }, "training curve "), pick, holder);
    draw();
  }
  box.replaceChildren(...kids);
}

function fillSelect(id, values, first) {
  const sel = document.getElementById(id), cur = sel.value;
  sel.replaceChildren(el("option", { value: "" }, first), ...values.map(v => el("option", { value: v }, v)));
  sel.value = values.map(String).includes(cur) ? cur : "";
}

async function loadList() {
  const p = new URLSearchParams({ offset: state.offset, limit: PAGE });
  for (const id of ["correct", "length", "workflow", "q"]) {
    const v = document.getElementById(id).value;
    if (v) p.set(id, v);
  }
  const list = document.getElementById("list");
  let r;
  try { r = await api(`runs/${state.run}/questions?${p}`); } catch (e) { list.replaceChildren(el("div", { class: "error" }, e.message)); return; }
  state.total = r.total;
  fillSelect("length", r.lengths, "any length");
  fillSelect("workflow", r.workflows, "any workflow");
  document.getElementById("range").textContent = r.total ? `${r.offset + 1}–${r.offset + r.items.length} of ${r.total}` : "none";
  list.replaceChildren(...r.items.map(q => el("div", { class: "q" + (q.idx === state.idx ? " sel" : ""), "data-idx": q.idx,
    onclick: () => openRow(q.idx) },
    el("div", { class: "t" }, el("span", { class: q.correct ? "ok" : "bad" }, q.correct ? "✓ " : "✗ "), q.question || q.task_id),
    el("div", { class: "m" }, `${q.key} · ${q.workflow} · ${q.calls} calls · pred: ${q.prediction || "∅"}`))));
  if (!r.items.length) list.append(el("p", { class: "hint", style: "padding:8px" }, "no questions match"));
}

// ------------------------------------------------------------------ one trajectory

async function openRow(idx) {
  state.idx = idx;
  state.shown = state.run;
  location.hash = `run=${state.run}&idx=${idx}`;
  document.querySelectorAll(".q").forEach(n => n.classList.toggle("sel", +n.dataset.idx === idx));
  const main = document.getElementById("main");
  main.replaceChildren(el("p", { class: "hint" }, "loading…"));
  let row;
  try { row = await api(`runs/${state.run}/rows/${idx}`); } catch (e) { main.replaceChildren(el("div", { class: "error" }, e.message)); return; }
  const cols = [renderColumn(state.run, row)];
  if (state.runs.length > 1) {
    const other = 1 - state.run;
    let col;
    try {
      const f = await api(`runs/${other}/find?key=${encodeURIComponent(row.key)}`);
      col = f.idx === null ? el("div", { class: "col" }, el("h2", {}, state.runs[other].name), el("p", { class: "hint" }, `question ${row.key} is not in this run`))
        : renderColumn(other, await api(`runs/${other}/rows/${f.idx}`));
    } catch (e) { col = el("div", { class: "col" }, el("div", { class: "error" }, e.message)); }
    cols.push(col);
  }
  main.replaceChildren(el("div", { class: "cols", id: cols.length > 1 ? "side-by-side" : "single" }, cols));
}

function goldMarked(text, answers) {
  // The memory text with gold answers highlighted (case-insensitive).
  const words = (answers || []).filter(a => a && a.trim()).map(a => a.replace(/[.*+?^${}()|[\]\\]/g, "\\$&"));
  if (!words.length) return [text];
  const re = new RegExp(`(${words.join("|")})`, "gi");
  return text.split(re).map((part, i) => i % 2 ? el("mark", { class: "goldword" }, part) : part);
}

function diffNodes(ops, answers) {
  return ops.map(([op, text]) => op === "+" ? el("ins", { class: "add" }, goldMarked(text, answers))
    : op === "-" ? el("del", { class: "del" }, text) : goldMarked(text, answers));
}

function renderColumn(run, row) {
  const answers = row.answers || [];
  const steps = row.steps || [];
  const ctx = steps.map(s => (s.info && typeof s.info.context_tokens === "number") ? s.info.context_tokens : s.prompt_tokens);
  const head = el("div", { class: "qhead" },
    el("div", { class: "question" }, row.question || row.task_id),
    el("div", {}, "gold: ", el("b", {}, answers.join(" | ") || "–"), " · prediction: ",
      el("b", { class: row.correct ? "ok" : "bad" }, row.prediction || "∅")),
    el("div", { class: "meta" }, [row.key, row.workflow || state.runs[run].kind,
      row.em !== undefined ? `EM ${row.em} · sub-EM ${row.sub_em} · F1 ${fmt(row.f1)}` : null,
      row.reward !== undefined ? `reward ${fmt(row.reward)}` : null,
      row.group_rewards ? `group rewards [${row.group_rewards.map(x => fmt(x, 2)).join(", ")}]` : null,
      `${steps.length} calls`].filter(Boolean).join(" · ")),
    el("div", { class: "label" }, "context tokens per call"), barChart(ctx, "tokens"));
  if (!steps.length && row.memory_trace) {  // rows written before per-call records existed
    return el("div", { class: "col" }, el("h2", {}, state.runs[run].name), head,
      row.memory_trace.map((m, i) => el("div", { class: "step" }, el("div", { class: "head" }, `memory ${i}`), el("div", { class: "memory" }, m))));
  }
  return el("div", { class: "col", "data-run": run }, el("h2", {}, state.runs[run].name), head,
    steps.map((s, j) => renderStep(run, row.idx, j, s, answers)));
}

function renderStep(run, idx, j, s, answers) {
  const info = s.info || {};
  const final = s.kind === "final";
  const badges = [el("b", {}, final ? "final answer" : `${s.kind} ${s.step}`),
    el("span", { class: "badge" }, `ctx ${typeof info.context_tokens === "number" ? info.context_tokens : s.prompt_tokens} tok`),
    el("span", { class: "badge" }, `gen ${s.response_tokens} tok`)];
  if (s.step_reward !== null && s.step_reward !== undefined) badges.push(el("span", { class: "badge" }, `step reward ${fmt(s.step_reward)}`));
  if (s.advantage !== null && s.advantage !== undefined) badges.push(el("span", { class: "badge" }, `advantage ${fmt(s.advantage)}`));
  if (s.trained_tokens === 0) badges.push(el("span", { class: "badge untrained" }, "not trained"));
  if (s.gold_event) badges.push(el("span", { class: `badge gold-${s.gold_event}` }, s.gold_event === "appeared" ? "answer entered memory" : "answer left memory"));
  const box = el("div", { class: "step" + (final ? " final" : ""), "data-step": j }, el("div", { class: "head" }, badges));
  if (info.chunk_chars !== undefined) {
    const pre = el("pre", { class: "chunktext" }, "loading…");
    const det = el("details", { class: "chunk" }, el("summary", {}, `chunk ${info.chunk_index ?? j} (${info.chunk_tokens ?? "?"} tokens, ${info.chunk_chars} chars)`), pre);
    det.addEventListener("toggle", async () => {
      if (!det.open || det.dataset.loaded) return;
      det.dataset.loaded = "1";
      try { pre.replaceChildren(...goldMarked((await api(`runs/${run}/rows/${idx}/chunk/${j}`)).chunk, answers)); } catch (e) { pre.replaceChildren(el("span", { class: "bad" }, e.message)); }
    });
    box.append(det);
  }
  if (info.shown_recalled_memory !== undefined && info.shown_recalled_memory !== null) {
    box.append(el("details", {}, el("summary", {}, "recalled memory shown in this prompt"), el("pre", {}, info.shown_recalled_memory)));
  }
  if (info.recall_query) {
    box.append(el("div", { class: "recall" }, el("div", { class: "label" }, "recall"),
      el("div", {}, "query: ", el("b", {}, info.recall_query)),
      el("div", {}, info.recalled_memory ? ["→ memory of step ", el("b", {}, info.recalled_step), ` (score ${fmt(info.recall_score)}): `, goldMarked(info.recalled_memory, answers)] : "→ nothing recalled")));
  }
  if (info.action) {
    // InfMem's plan (retrieve / stop / none) and MEM1's turn (search / answer / invalid)
    const acts = [el("div", { class: "label" }, "action"), el("b", { class: "action-" + info.action }, info.action === "stop" ? "stop reading" : info.action)];
    if (info.calls_well_formed === false) acts.push(el("span", { class: "badge bad" }, "ill-formed call"));
    if (info.query) acts.push(el("div", {}, "query: ", el("b", {}, info.query)));
    for (const r of info.retrievals || []) acts.push(el("div", {}, "retrieve: ", el("b", {}, r.query), ` (top_k ${r.top_k})`, r.well_formed ? "" : " — ill-formed, searched the problem"));
    box.append(el("div", { class: "recall actions" }, acts));
  }
  if (typeof info.internal_state === "string") {
    box.append(el("div", { class: "label" }, "internal state (the only memory carried to the next turn)"),
      el("div", { class: "memory internal-state" }, goldMarked(info.internal_state, answers)));
  }
  if (typeof info.memory_shown === "string") box.append(el("details", {}, el("summary", {}, "memory shown to the planner"), el("div", { class: "memory" }, goldMarked(info.memory_shown, answers))));
  if (typeof info.retrieved === "string") box.append(el("details", { class: "retrieved" }, el("summary", {}, "retrieved passages shown in this prompt"), el("pre", {}, goldMarked(info.retrieved, answers))));
  if (typeof info.observation === "string") box.append(el("details", { class: "observation" }, el("summary", {}, "observation (next turn's context)"), el("pre", {}, goldMarked(info.observation, answers))));
  if (info.memory_finished === false) box.append(el("span", { class: "badge bad" }, "memory write unfinished"));
  for (const [key, cls, title] of [["tool_calls", "tool", "tool calls"], ["tool_results", "tool", "tool results"]]) {
    const v = info[key];
    if (v === undefined || v === null || (Array.isArray(v) && !v.length)) continue;
    box.append(el("div", { class: cls + " " + key }, el("div", { class: "label" }, title),
      (Array.isArray(v) ? v : [v]).map(x => el("pre", {}, json(x)))));
  }
  if (Array.isArray(info.prunes) && info.prunes.length) {
    box.append(el("div", { class: "prune prunes" }, el("div", { class: "label" }, "prunes"), info.prunes.map(p => {
      if (p && typeof p === "object" && !Array.isArray(p)) {
        const ids = p.deleted_ids ?? p.deleted ?? p.ids;
        const mem = p.memory ?? p.memory_text;
        const rest = Object.fromEntries(Object.entries(p).filter(([k]) => !["deleted_ids", "deleted", "ids", "memory", "memory_text"].includes(k)));
        return el("div", {}, ids !== undefined ? el("div", {}, "deleted: ", el("b", {}, json(ids))) : null,
          mem !== undefined ? el("div", {}, "memory written: ", el("span", { class: "memory" }, goldMarked(String(mem), answers))) : null,
          Object.keys(rest).length ? el("pre", {}, json(rest)) : null);
      }
      return el("pre", {}, json(p));
    })));
  }
  // the context-management family: a branch folded into its returned message, a summary, a window shift
  if (info.kind === "branch") {
    box.append(el("div", { class: "fold branch" }, el("div", { class: "label" }, `branch ${info.thread ?? ""}: ${info.description ?? ""}`),
      info.prompt ? el("div", {}, "task: ", el("span", {}, info.prompt)) : null,
      Array.isArray(info.queries) && info.queries.length ? el("div", {}, "searched: ", el("b", {}, info.queries.join(" | "))) : null,
      el("div", {}, info.returned !== null && info.returned !== undefined
        ? ["folded into: ", el("span", { class: "memory" }, goldMarked(String(info.returned), answers))]
        : el("span", { class: "bad" }, `ended without returning (${info.end ?? "?"})`))));
  }
  if (info.kind === "main" && Array.isArray(info.branch_turns) && info.branch_turns.length) {
    box.append(el("div", { class: "fold main" }, el("div", { class: "label" }, "main thread"), `branches opened at turns ${info.branch_turns.join(", ")}`));
  }
  if (typeof info.summary === "string") {
    box.append(el("div", { class: "fold summary" }, el("div", { class: "label" }, `summary ${info.part ?? ""} (the context restarts from it)`),
      el("span", { class: "memory" }, goldMarked(info.summary, answers))));
  }
  if (info.kind === "window" && info.dropped !== undefined) {
    box.append(el("div", { class: "fold window" }, el("div", { class: "label" }, "window shift"), `turn ${info.dropped} left the context`));
  }
  if (!final && typeof info.memory === "string") {
    box.append(el("div", { class: "label" }, "memory after this step", s.memory_diff ? " (green: added, red: removed)" : ""),
      el("div", { class: "memory" + (s.gold_in_memory ? " gold" : "") }, s.memory_diff ? diffNodes(s.memory_diff, answers) : goldMarked(info.memory, answers)));
    if (s.response && s.response !== info.memory) box.append(el("details", {}, el("summary", {}, "generated text"), el("pre", {}, s.response)));
  } else if (final) {
    if (typeof info.memory === "string") box.append(el("details", {}, el("summary", {}, "memory it answered from"), el("div", { class: "memory" }, goldMarked(info.memory, answers))));
    box.append(el("div", { class: "label" }, "answer"), el("pre", { class: "answer" }, goldMarked(s.response || "", answers)));
  } else if (s.response) {
    box.append(el("div", { class: "label" }, "generated text"), el("pre", {}, s.response));
  }
  const rest = Object.entries(info).filter(([k]) => !KNOWN.has(k));
  if (rest.length) {
    // Keys this page does not know (any workflow's extras): short values inline, long ones as a block.
    box.append(el("div", { class: "kv" }, rest.map(([k, v]) => {
      const text = typeof v === "object" && v !== null ? JSON.stringify(v) : String(v);
      return text.length > 80 ? el("details", { class: "kvi" }, el("summary", {}, k), el("pre", {}, json(v)))
        : el("span", { class: "kvi" }, el("span", { class: "k" }, k + ": "), text);
    })));
  }
  return box;
}

init().catch(e => showError(e.message));
