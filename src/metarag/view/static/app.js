// metarag view: the runs page, the question list and the question page, over the JSON of server.py.
// Every text from a run goes in through textContent (never innerHTML): traces hold model output.
"use strict";

const main = document.getElementById("main");
const statusLine = document.getElementById("status");
let RUNS = null; // the /api/runs answer, fetched once per visit of the runs page or on first need

function h(tag, attrs = {}, ...kids) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const kid of kids.flat(Infinity)) {
    if (kid === null || kid === undefined || kid === false) continue;
    node.appendChild(typeof kid === "string" || typeof kid === "number" ? document.createTextNode(String(kid)) : kid);
  }
  return node;
}

async function api(path) {
  const response = await fetch(path, { cache: "no-store" });
  let body;
  try { body = await response.json(); } catch (e) { throw new Error(`${path}: the server answered no JSON`); }
  if (!response.ok) throw new Error(body && body.error ? body.error : `${path}: HTTP ${response.status}`);
  return body;
}

const fmt = (v, digits = 2) => {
  if (v === null || v === undefined) return "–";
  if (typeof v === "boolean") return v ? "yes" : "no";
  if (typeof v === "number") return Number.isInteger(v) ? String(v) : (Math.abs(v) < 0.01 && v !== 0 ? v.toPrecision(2) : v.toFixed(digits));
  return String(v);
};
const pretty = (v) => JSON.stringify(v, null, 1);
const short = (text, n = 160) => (text && text.length > n ? text.slice(0, n - 1) + "…" : text || "");

function cellClass(cell) {
  if (!cell) return "cell-missing";
  if (cell.failed) return "cell-failed";
  if (cell.em >= 1) return "cell-right";
  if (cell.f1 > 0) return "cell-partial";
  return "cell-wrong";
}

function setActive(name) {
  for (const id of ["nav-runs", "nav-questions"]) document.getElementById(id).classList.toggle("active", id === name);
}

function fail(error) {
  main.replaceChildren(h("div", { class: "error", id: "page-error" }, `The page could not be shown: ${error.message || error}`));
}

let generation = 0; // a newer navigation wins over an older one still waiting for its data

function show(mine, ...nodes) {
  if (mine !== generation) return false;
  main.replaceChildren(...nodes);
  return true;
}

async function route() {
  const mine = ++generation;
  const hash = location.hash || "#/";
  try {
    if (hash.startsWith("#/q/")) {
      setActive(null);
      await questionPage(mine, decodeURIComponent(hash.slice(4)));
    } else if (hash.startsWith("#/questions")) {
      setActive("nav-questions");
      await listPage(mine, new URLSearchParams(hash.split("?")[1] || ""));
    } else {
      setActive("nav-runs");
      await runsPage(mine);
    }
  } catch (error) {
    if (mine === generation) fail(error);
  }
}

async function runsInfo(refresh = false) {
  if (!RUNS || refresh) RUNS = await api("/api/runs");
  return RUNS;
}

// ------------------------------------------------------------------------------------ runs page
async function runsPage(mine) {
  const data = await runsInfo(true);
  const page = [h("h1", {}, "Runs")];
  const bad = data.runs.filter((r) => r.error);
  for (const r of bad) page.push(h("div", { class: "run-error" }, h("b", {}, r.name), ": ", r.error));
  const table = data.table;
  if (table.columns.length) {
    const head = h("tr", {}, h("th", {}, "run"), table.columns.map((c) => h("th", {}, c)));
    const rows = table.cells.map((cells, i) => {
      const run = data.runs[table.runs[i]];
      return h("tr", { class: "run-row", "data-run": run.index },
        h("td", {}, h("a", { href: `#/questions?a=0&b=${run.index}` }, run.name)), cells.map((c) => h("td", {}, c)));
    });
    page.push(h("p", { class: "muted small" }, "The table metarag report prints, computed by the same code ",
      "(evaluate/report.py): paired tests against the first run (exact McNemar on EM and cover-EM, a ",
      "permutation test on F1), * where the Holm-adjusted p is below 0.05."));
    page.push(h("div", { class: "scroll" }, h("table", { class: "report", id: "report" }, h("thead", {}, head),
      h("tbody", {}, rows))));
  } else {
    page.push(h("p", { class: "muted" }, "No run with finished questions to tabulate."));
  }
  for (const note of table.notes) page.push(h("div", { class: "warning table-note" }, note));
  page.push(h("div", { class: "run-cards" }, data.runs.filter((r) => !r.error).map(runCard)));
  page.push(h("p", {}, h("a", { href: "#/questions", id: "to-questions" }, "Question by question →")));
  if (!show(mine, ...page)) return;
  statusLine.textContent = `${data.runs.length} run folder(s)`;
}

function runCard(run) {
  const m = run.manifest || {};
  const sessions = Array.isArray(m.sessions) ? m.sessions : [];
  const last = sessions[sessions.length - 1] || {};
  const kv = [
    ["method", run.method], ["questions", `${run.n_results} of ${run.n_questions} finished`],
    ["failed", run.failed], ["model", m.model_identity], ["model sha256", m.model_sha256],
    ["dataset sha256", m.dataset_sha256 || (run.settings && run.settings.dataset && run.settings.dataset.sha256)],
    ["commit", m.git_commit], ["metarag", m.metarag_version], ["created", m.created],
    ["sessions", sessions.length ? `${sessions.length}, last ${last.outcome || "running or killed"}` : "none"],
    ["folder", run.path],
  ];
  const problems = run.problems || [];
  const shown = problems.slice(0, 20);
  return h("div", { class: "card run-card", "data-run": run.index },
    h("h2", {}, run.name),
    h("dl", { class: "kv" }, kv.map(([k, v]) => [h("dt", {}, k), h("dd", {}, fmt(v))])),
    shown.map((p) => h("div", { class: "problem" }, p.message)),
    problems.length > shown.length ? h("div", { class: "problem" }, `… and ${problems.length - shown.length} more problems`) : null,
    h("details", { class: "settings" }, h("summary", {}, "settings (resolved, hashed into the run id)"),
      h("pre", {}, pretty(run.settings))),
    h("details", {}, h("summary", {}, "manifest"), h("pre", {}, pretty(run.manifest))));
}

// ------------------------------------------------------------------------------- question list
const FILTER_LABELS = {
  "all": "all questions", "wrong-any": "wrong in some run", "flip": "wrong in run A, right in run B",
  "differ": "right in one run, wrong in another", "failed": "failed in some run",
  "over-search": "over-searched (agent runs)", "under-search": "under-searched (agent runs)",
};
const METRIC_LABELS = { em: "EM", f1: "F1", requests: "requests", tokens: "tokens", latency: "latency",
                        retrievals: "retrievals", steps: "steps" };

async function listPage(mine, params) {
  const info = await runsInfo();
  const shown = info.runs.filter((r) => !r.error); // folders that are no run are said on the runs page
  const first = shown.length ? shown[0].index : 0, second = shown.length > 1 ? shown[1].index : first;
  const state = {
    filter: params.get("filter") || "all", a: params.get("a") || String(first), b: params.get("b") || String(second),
    type: params.get("type") || "", q: params.get("q") || "", sort: params.get("sort") || "order",
    order: params.get("order") || "asc", offset: params.get("offset") || "0", limit: params.get("limit") || "50",
  };
  const query = new URLSearchParams(state).toString();
  const data = await api(`/api/questions?${query}`);
  // every control's value as it is now, so that changes made in quick succession all count
  const current = () => {
    const out = {};
    for (const [key, id] of [["filter", "filter"], ["a", "run-a"], ["b", "run-b"], ["type", "type"],
                             ["q", "search"], ["sort", "sort"], ["order", "order"]]) {
      const control = controls.querySelector(`#${id}`);
      if (control) out[key] = control.value;
    }
    return out;
  };
  const go = (changes) => {
    const next = { ...state, ...current(), offset: "0", ...changes };
    location.hash = `#/questions?${new URLSearchParams(next).toString()}`;
  };
  const select = (id, label, value, options, onchange) => h("label", {}, label,
    h("select", { id, onchange: (e) => onchange(e.target.value) },
      options.map(([v, text]) => h("option", { value: v, selected: String(v) === String(value) }, text))));
  const runOptions = shown.map((r) => [String(r.index), `${r.index}: ${r.name}`]);
  const sortOptions = [["order", "dataset order"]];
  shown.forEach((r) => info.metrics.forEach((m) => sortOptions.push([`${r.index}:${m}`, `${r.index}: ${METRIC_LABELS[m] || m}`])));
  const search = h("input", { id: "search", type: "search", value: state.q, placeholder: "question, id or answer" });
  search.addEventListener("keydown", (e) => { if (e.key === "Enter") go({ q: search.value }); });
  const controls = h("div", { class: "controls" },
    select("filter", "show", state.filter, info.filters.map((f) => [f, `${FILTER_LABELS[f] || f} (${data.counts[f]})`]),
      (v) => go({ filter: v })),
    select("run-a", "run A", state.a, runOptions, (v) => go({ a: v })),
    select("run-b", "run B", state.b, runOptions, (v) => go({ b: v })),
    select("type", "question type", state.type, [["", "any type"], ...data.types.map((t) => [t, t])], (v) => go({ type: v })),
    h("label", {}, "search", search),
    select("sort", "sort by", state.sort, sortOptions, (v) => go({ sort: v })),
    select("order", "order", state.order, [["asc", "ascending"], ["desc", "descending"]], (v) => go({ order: v })));
  const offset = Number(state.offset), limit = Number(state.limit);
  const pager = (ids) => h("div", { class: "pager" },
    h("button", { id: ids && "prev", disabled: offset <= 0, onclick: () => go({ offset: String(Math.max(0, offset - limit)) }) }, "← previous"),
    h("span", { id: ids && "total" }, data.total ? `${offset + 1}–${Math.min(offset + limit, data.total)} of ${data.total} questions`
                                                 : "no question matches"),
    h("button", { id: ids && "next", disabled: offset + limit >= data.total, onclick: () => go({ offset: String(offset + limit) }) }, "next →"));
  const page = [h("h1", {}, "Questions"), controls];
  for (const note of data.notes) page.push(h("div", { class: "warning" }, note));
  if (data.pairs) {
    const p = data.pairs, A = info.runs[p.a].name, B = info.runs[p.b].name;
    page.push(h("div", { class: "card pairs", id: "pairs" },
      h("b", {}, `B (${B}) against A (${A})`), ` over ${p.n} questions both answered — EM: `,
      h("span", { class: "badge yes" }, `${p.em.wins} wins`), " ", h("span", { class: "badge no" }, `${p.em.losses} losses`),
      ` ${p.em.ties} ties; F1: ${p.f1.wins} higher, ${p.f1.losses} lower, ${p.f1.ties} equal`));
  }
  page.push(h("div", { class: "legend small" }, h("span", { class: "cell-right" }, "right (EM 1)"),
    h("span", { class: "cell-partial" }, "partly (F1 > 0)"), h("span", { class: "cell-wrong" }, "wrong"),
    h("span", { class: "cell-failed" }, "failed"), h("span", { class: "cell-missing" }, "no result")));
  page.push(pager(true));
  const head = h("tr", {}, h("th", {}, "id"), h("th", {}, "question"), h("th", {}, "type"), h("th", {}, "gold"),
    shown.map((r) => h("th", { title: r.path }, `${r.index}: ${short(r.name, 40)}`)));
  const rows = data.items.map((item) => h("tr", { class: "q-row", "data-id": item.id,
                                                 onclick: () => { location.hash = `#/q/${encodeURIComponent(item.id)}`; } },
    h("td", {}, item.id), h("td", { class: "qtext" }, item.question), h("td", {}, item.type || "–"),
    h("td", {}, item.golds.join(" | ")), shown.map((r) => answerCell(item.runs[r.index]))));
  page.push(h("div", { class: "scroll" }, h("table", { id: "questions" }, h("thead", {}, head), h("tbody", {}, rows))));
  page.push(pager(false));
  if (!show(mine, ...page)) return;
  statusLine.textContent = `${data.total} questions`;
}

function answerCell(cell) {
  if (!cell) return h("td", { class: "cell-missing" }, "–");
  const flags = [];
  if (cell.over_search) flags.push(h("span", { class: "flag", title: "searched more than it needed" }, "over"));
  if (cell.under_search) flags.push(h("span", { class: "flag", title: "stopped searching too soon" }, "under"));
  if (cell.unreadable_steps) flags.push(h("span", { class: "flag", title: "steps this metarag cannot read" }, "raw"));
  return h("td", { class: `answer ${cellClass(cell)}`, title: cell.error || "" },
    h("div", { class: "ans" }, cell.failed ? "failed" : (cell.answer || "(empty)"), flags),
    cell.failed ? h("div", { class: "metrics" }, short(cell.error, 80)) : null,
    h("div", { class: "metrics" }, `EM ${fmt(cell.em)} · F1 ${fmt(cell.f1)} · ${cell.requests} req${cell.cached_requests ? ` (${cell.served_requests} served, ${cell.cached_requests} cached)` : ""} · ${cell.tokens} tok · ${fmt(cell.latency)} s`));
}

// ------------------------------------------------------------------------------- question page
async function questionPage(mine, id) {
  const data = await api(`/api/question?id=${encodeURIComponent(id)}`);
  const supporting = new Set(data.supporting || []);
  const page = [
    h("p", {}, h("a", { href: "#/questions", onclick: (e) => { if (history.length > 1) { e.preventDefault(); history.back(); } } }, "← questions")),
    h("div", { class: "card qhead" },
      h("h1", { id: "qtitle" }, data.question || id),
      h("dl", { class: "kv" },
        h("dt", {}, "id"), h("dd", {}, data.id),
        h("dt", {}, "gold"), h("dd", { class: "gold" }, data.golds.join(" | ") || "–"),
        h("dt", {}, "type"), h("dd", {}, fmt(data.type)), h("dt", {}, "hops"), h("dd", {}, fmt(data.hops)),
        h("dt", {}, "supporting"), h("dd", {}, data.supporting.length ? data.supporting.join(", ") : "unknown"))),
  ];
  for (const note of data.notes) page.push(h("div", { class: "warning" }, note));
  const isNoRun = (run) => !run.method; // a folder that is no run: the runs page says why
  const kept = data.runs.filter((run) => !isNoRun(run));
  const columns = h("div", { class: "columns", style: `--n: ${kept.length}` },
    kept.map((run) => runColumn(run, data, supporting)));
  page.push(columns);
  if (!show(mine, ...page)) return;
  statusLine.textContent = `question ${data.id}`;
}

function runColumn(run, data, supporting) {
  const column = h("section", { class: "run-column", "data-run": run.index });
  column.appendChild(h("h2", {}, `${run.index}: ${run.name}`));
  if (!run.result) {
    column.appendChild(h("div", { class: "run-error" }, run.error || "no result"));
    return column;
  }
  const r = run.result, cell = run.cell;
  column.appendChild(h("div", { class: `summary ${cellClass(cell)}` },
    h("div", {}, h("b", {}, run.method), r.error ? " — failed" : ""),
    h("div", { class: "ans run-answer" }, "answer: ", r.error ? "(none)" : (r.prediction || "(empty)"),
      " ", r.error ? null : h("span", { class: "muted" }, `against ${data.golds.join(" | ")}`)),
    h("div", { class: "metrics" }, `EM ${fmt(r.scores.em)} · F1 ${fmt(r.scores.f1)} · support recall ${fmt(r.support_recall)}`,
      ` (first round ${fmt(r.first_support_recall)}) · ${cell.requests} requests${cell.cached_requests ? ` (${cell.served_requests} served by the model, ${cell.cached_requests} by the response cache)` : ""} · ${cell.tokens} tokens · ${fmt(cell.latency)} s`),
    r.error ? h("pre", { class: "trace-error" }, r.error + (r.retryable ? "\n(retryable: a re-run tries it again)" : "")) : null));
  if (run.error) column.appendChild(h("div", { class: "run-error" }, run.error));
  if (!run.trace) return column;
  const steps = run.trace.steps;
  const charts = h("div", { class: "charts" });
  const decisions = steps.filter((s) => s && s.kind === "decide" && s.signals && typeof s.signals.d_near === "number");
  if (decisions.length) {
    charts.appendChild(h("h3", {}, "EvoCtx trajectory: distance to the knowledge boundary by round"));
    charts.appendChild(Charts.evoctx(decisions, thresholdsOf(run, steps)));
  }
  if (steps.length) {
    charts.appendChild(h("h3", {}, "Steps as a timeline"));
    charts.appendChild(Charts.timeline(steps));
    charts.appendChild(h("h3", {}, "Cost and latency per step"));
    charts.appendChild(Charts.costPerStep(steps));
  }
  column.appendChild(charts);
  const maxTok = Math.max(1, ...steps.map((s) => tokens(s)));
  const maxLat = Math.max(1e-9, ...steps.map((s) => latency(s)));
  steps.forEach((step, i) => column.appendChild(stepCard(step, i, steps, { supporting, maxTok, maxLat, golds: data.golds, run })));
  return column;
}

function thresholdsOf(run, steps) {
  const s = run.method_settings || {};
  const out = {};
  for (const k of ["tau_near", "tau_cent", "tau_90"]) if (typeof s[k] === "number") out[k] = s[k];
  if (Object.keys(out).length) return out;
  const judge = steps.find((x) => x && x.kind === "judge" && /thresholds \(([^)]*)\)/.test(x.detail || ""));
  if (judge) {
    const values = judge.detail.match(/thresholds \(([^)]*)\)/)[1].split(",").map(Number);
    ["tau_near", "tau_cent", "tau_90"].forEach((k, i) => { if (isFinite(values[i])) out[k] = values[i]; });
  }
  return out;
}

const usageOf = (s) => (s && typeof s.usage === "object" && s.usage) || {};
const tokens = (s) => (Number(usageOf(s).prompt_tokens) || 0) + (Number(usageOf(s).completion_tokens) || 0);
const latency = (s) => Number(usageOf(s).latency_s) || 0;

function costBar(step, ctx) {
  const t = tokens(step), l = latency(step), u = usageOf(step);
  const extra = [];
  if (u.llm_requests) extra.push(`${u.llm_requests} req`);
  if (u.retrieval_calls) extra.push(`${u.retrieval_calls} retr`);
  if (u.cache_hits) extra.push("cached");
  return h("span", { class: "costbar", title: `prompt ${u.prompt_tokens || 0} + completion ${u.completion_tokens || 0} tokens, ${l.toFixed(3)} s` },
    h("span", { class: "bar tok" }, h("i", { style: `width: ${(100 * t) / ctx.maxTok}%` })), `${t} tok`,
    h("span", { class: "bar lat" }, h("i", { style: `width: ${(100 * l) / ctx.maxLat}%` })), `${l.toFixed(2)} s`,
    extra.length ? ` · ${extra.join(" · ")}` : "");
}

// fields each kind's renderer shows; any other field goes under "other fields" (new ones from newer runs)
const SHOWN = {
  retrieve: ["query", "k", "hits"], rerank: ["reranker", "query", "before", "hits", "fallback"],
  generate: ["purpose", "prompt", "text", "logprobs", "prompt_ids", "cut"], score: ["purpose", "prompt", "labels", "probs", "prompt_ids"],
  judge: ["name", "verdict", "score", "inputs", "detail", "fallback"], decide: ["name", "choice", "signals"], answer: ["text"],
};

function stepCard(step, i, steps, ctx) {
  const known = step && !step._note && SHOWN[step.kind];
  const kind = known ? step.kind : "unknown";
  const card = h("div", { class: `step${known ? "" : " unknown-step"}`, "data-kind": kind, "data-index": i });
  const head = h("div", { class: "head" }, h("span", { class: "num" }, `#${i + 1}`),
    h("span", { class: "kind" }, (step && step.kind) || "?"));
  card.appendChild(head);
  if (!known) {
    head.appendChild(costBar(step, ctx));
    card.appendChild(h("div", { class: "warning step-note" },
      (step && step._note) || `unknown step kind ${JSON.stringify(step && step.kind)}`, ": shown as raw JSON"));
    const raw = { ...step };
    delete raw._note;
    card.appendChild(h("pre", { class: "raw" }, pretty(step && step._raw !== undefined ? step._raw : raw)));
    return card;
  }
  RENDER[step.kind](step, card, head, i, steps, ctx);
  head.appendChild(costBar(step, ctx));
  const others = Object.keys(step).filter((k) => !["kind", "usage", ...SHOWN[step.kind]].includes(k));
  if (others.length) {
    const rest = {};
    for (const k of others) rest[k] = step[k];
    card.appendChild(h("details", { class: "other-fields" }, h("summary", {}, `other fields (${others.join(", ")})`),
      h("pre", {}, pretty(rest))));
  }
  return card;
}

function messagesBlock(step, label) {
  const prompt = Array.isArray(step.prompt) ? step.prompt : [];
  const body = prompt.length
    ? prompt.map((m) => [h("div", { class: "small muted" }, (m && m.role) || "?"), h("pre", {}, (m && m.content) || "")])
    : [h("pre", {}, Array.isArray(step.prompt_ids) ? `(a prompt of ${step.prompt_ids.length} token ids)` : "(no prompt recorded)")];
  const chars = prompt.reduce((a, m) => a + ((m && m.content) || "").length, 0);
  return h("details", { class: "prompt" }, h("summary", {}, `${label} (${prompt.length} message(s), ${chars} characters)`), body);
}

function hitsTable(hits, ctx, extra = null) {
  if (!Array.isArray(hits) || !hits.length) return h("div", { class: "muted small" }, "no passages");
  const head = h("tr", {}, h("th", {}, "#"), extra ? h("th", {}, extra.label) : null, h("th", {}, "passage"),
    h("th", {}, "score"), h("th", { title: "a supporting passage of the question" }, "support"));
  const rows = hits.map((hit, j) => {
    const p = (hit && hit.passage) || {};
    const sup = ctx.supporting.has(p.id);
    return h("tr", { class: sup ? "support" : "" }, h("td", { class: "num" }, j + 1),
      extra ? h("td", { class: "num" }, extra.value(p.id, j)) : null,
      h("td", {}, h("details", {}, h("summary", {}, h("b", {}, p.title || "(untitled)"), h("span", { class: "muted" }, ` ${p.id || ""}`)),
        h("div", { class: "small" }, p.text || ""))),
      h("td", { class: "num" }, fmt(hit && hit.score, 3)), h("td", {}, sup ? h("span", { class: "sup" }, "✓") : ""));
  });
  return h("table", { class: "hits" }, h("thead", {}, head), h("tbody", {}, rows));
}

const RENDER = {
  retrieve(step, card, head, i, steps, ctx) {
    head.appendChild(h("span", {}, "query: ", h("b", {}, step.query), h("span", { class: "muted" }, ` (k ${step.k})`)));
    // the rerank of this retrieval, if one follows before the next retrieval: show each passage's rank after it
    let rerank = null;
    for (let j = i + 1; j < steps.length && steps[j] && steps[j].kind !== "retrieve"; j++)
      if (steps[j].kind === "rerank") { rerank = steps[j]; break; }
    const after = rerank ? new Map((rerank.hits || []).map((x, j) => [x && x.passage && x.passage.id, j + 1])) : null;
    card.appendChild(hitsTable(step.hits, ctx, after ? { label: "after rerank", value: (id) => after.get(id) || "dropped" } : null));
  },
  rerank(step, card, head, i, steps, ctx) {
    head.appendChild(h("span", {}, h("b", {}, step.reranker), ` kept ${(step.hits || []).length} of ${(step.before || []).length}`));
    if (step.fallback) card.appendChild(h("div", { class: "warning" }, `fell back to the retrieval order: ${step.fallback}`));
    const before = new Map((step.before || []).map((id, j) => [id, j + 1]));
    card.appendChild(hitsTable(step.hits, ctx, { label: "rank before", value: (id) => before.get(id) || "?" }));
  },
  generate(step, card, head) {
    head.appendChild(h("span", {}, "purpose: ", h("b", {}, step.purpose)));
    if (step.cut) head.appendChild(h("span", { class: "badge cut", title: "the reply ran into its max_tokens: cut, not ended by a stop string or the model" }, "cut at max_tokens"));
    card.appendChild(h("pre", { class: "output" }, step.text || "(empty output)"));
    card.appendChild(messagesBlock(step, "prompt"));
    if (Array.isArray(step.logprobs) && step.logprobs.length) {
      card.appendChild(h("details", { class: "tokens" }, h("summary", {}, `tokens (${step.logprobs.length}) with log-probabilities`),
        h("pre", {}, step.logprobs.map((t) => `${JSON.stringify(t.token)}\t${fmt(t.logprob, 3)}`).join("\n"))));
    }
  },
  score(step, card, head) {
    head.appendChild(h("span", {}, "purpose: ", h("b", {}, step.purpose)));
    const labels = step.labels || [], probs = step.probs || [];
    const total = probs.reduce((a, b) => a + (Number(b) || 0), 0) || 1;
    card.appendChild(h("div", { class: "labels" }, labels.map((label, j) => h("div", {},
      h("b", {}, label), h("span", { class: "probbar", style: `width: ${Math.round(120 * (probs[j] || 0) / total)}px` }),
      `${fmt(probs[j], 3)}`, h("span", { class: "muted" }, ` (${fmt((probs[j] || 0) / total, 3)} over the labels)`)))));
    card.appendChild(messagesBlock(step, "prompt"));
  },
  judge(step, card, head) {
    head.appendChild(h("span", {}, h("b", {}, step.name), " → ", h("span", { class: "badge verdict" }, step.verdict),
      step.score !== null && step.score !== undefined ? ` score ${fmt(step.score, 3)}` : ""));
    if (step.fallback) card.appendChild(h("div", { class: "warning" }, `default verdict: ${step.fallback}`));
    if (step.detail) card.appendChild(h("pre", {}, step.detail));
    const inputs = step.inputs || {};
    if (Object.keys(inputs).length)
      card.appendChild(h("div", { class: "small muted" }, "input sizes: ",
        Object.entries(inputs).map(([k, v]) => `${k} ${v}`).join(", ")));
  },
  decide(step, card, head) {
    head.appendChild(h("span", {}, h("b", {}, step.name), " → ", h("span", { class: "badge choice" }, step.choice)));
    const signals = step.signals || {};
    const keys = Object.keys(signals);
    if (keys.length)
      card.appendChild(h("dl", { class: "kv signals" }, keys.map((k) => [h("dt", {}, k), h("dd", {}, fmt(signals[k], 3))])));
  },
  answer(step, card, head, i, steps, ctx) {
    const right = ctx.run.result && ctx.run.result.scores.em >= 1;
    head.appendChild(h("span", {}, h("b", {}, step.text), " ", h("span", { class: `badge ${right ? "yes" : "no"}` }, right ? "right" : "wrong"),
      h("span", { class: "muted" }, ` gold: ${ctx.golds.join(" | ")}`)));
  },
};

window.addEventListener("hashchange", route);
route();
