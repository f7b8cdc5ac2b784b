// Pictures drawn in the browser from a trace's JSON, as inline SVG: cost and latency per step, the
// steps as a timeline, and EvoCtx's trace-to-boundary distances by round against its thresholds.
"use strict";

const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const KIND_COLORS = {
    retrieve: "#2f7dd1", rerank: "#6a4fc8", generate: "#1f9d6b", score: "#c07a12", judge: "#c23b6c",
    decide: "#7a8a12", answer: "#333d4c",
  };
  const kindColor = (kind) => KIND_COLORS[kind] || "#9aa3ad";

  function el(tag, attrs = {}, ...kids) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) node.setAttribute(k, v);
    for (const kid of kids) {
      if (kid === null || kid === undefined) continue;
      node.appendChild(typeof kid === "string" ? document.createTextNode(kid) : kid);
    }
    return node;
  }
  const title = (text) => el("title", {}, text);
  const num = (v) => (typeof v === "number" && isFinite(v) ? v : 0);
  const usage = (step) => (step && typeof step.usage === "object" && step.usage) || {};
  const fmt = (v, d = 2) => (Math.abs(v) >= 100 ? v.toFixed(0) : Math.abs(v) < 0.01 && v !== 0 ? v.toPrecision(2) : v.toFixed(d));

  function frame(cls, w, h, label) {
    return el("svg", { class: cls, viewBox: `0 0 ${w} ${h}`, role: "img", "aria-label": label });
  }

  // Bars of tokens (prompt + completion) and of latency, one pair per step.
  function costPerStep(steps) {
    const W = 440, H = 170, left = 44, right = 10, top = 16, mid = 86, bottom = 150;
    const svg = frame("chart-cost", W, H, "tokens and latency per step");
    const n = steps.length;
    if (!n) return svg;
    const toks = steps.map((s) => num(usage(s).prompt_tokens) + num(usage(s).completion_tokens));
    const lats = steps.map((s) => num(usage(s).latency_s));
    const maxTok = Math.max(1, ...toks), maxLat = Math.max(1e-9, ...lats);
    const bw = (W - left - right) / n;
    svg.appendChild(el("text", { x: 4, y: top - 4 }, `tokens (highest ${maxTok})`));
    svg.appendChild(el("text", { x: 4, y: mid + 10 }, `latency, s (highest ${fmt(maxLat)})`));
    const tokH = mid - top - 8, latH = bottom - mid - 20;
    steps.forEach((s, i) => {
      const x = left + i * bw + bw * 0.1, w = Math.max(1, bw * 0.8);
      const th = (toks[i] / maxTok) * tokH, lh = (lats[i] / maxLat) * latH;
      const label = `step ${i + 1} ${s.kind || "?"}: ${toks[i]} tokens, ${lats[i].toFixed(3)} s`;
      svg.appendChild(el("rect", { x, y: mid - 8 - th, width: w, height: Math.max(th, toks[i] ? 1 : 0),
                                   fill: kindColor(s.kind) }, title(label)));
      svg.appendChild(el("rect", { x, y: bottom - lh, width: w, height: Math.max(lh, lats[i] ? 1 : 0),
                                   fill: kindColor(s.kind), opacity: 0.6 }, title(label)));
      if (n <= 40 || i % Math.ceil(n / 40) === 0)
        svg.appendChild(el("text", { x: x + w / 2, y: H - 6, "text-anchor": "middle" }, String(i + 1)));
    });
    svg.appendChild(el("line", { x1: left, x2: W - right, y1: mid - 8, y2: mid - 8, stroke: "#999" }));
    svg.appendChild(el("line", { x1: left, x2: W - right, y1: bottom, y2: bottom, stroke: "#999" }));
    return svg;
  }

  // The steps on a time axis (cumulative latency; step order where nothing was timed), one lane per
  // kind, control decisions labelled with their choice: an agent's turns at a glance.
  function timeline(steps) {
    const lanes = [];
    for (const s of steps) if (!lanes.includes(s.kind || "?")) lanes.push(s.kind || "?");
    const W = 440, laneH = 18, left = 62, right = 10, top = 18;
    const H = top + lanes.length * laneH + 22;
    const svg = frame("chart-timeline", W, H, "the steps as a timeline");
    const lats = steps.map((s) => num(usage(s).latency_s));
    const total = lats.reduce((a, b) => a + b, 0);
    const timed = total > 0;
    const span = timed ? total : steps.length || 1;
    const scale = (W - left - right) / span;
    lanes.forEach((k, j) => {
      svg.appendChild(el("text", { x: left - 6, y: top + j * laneH + 12, "text-anchor": "end" }, k));
      svg.appendChild(el("line", { x1: left, x2: W - right, y1: top + j * laneH + laneH - 1,
                                   y2: top + j * laneH + laneH - 1, stroke: "#eee" }));
    });
    let t = 0, lastLabel = -Infinity;
    steps.forEach((s, i) => {
      const d = timed ? lats[i] : 1;
      const j = lanes.indexOf(s.kind || "?");
      const x = left + t * scale, w = Math.max(2, d * scale - (timed ? 0 : 2));
      let label = `step ${i + 1} ${s.kind || "?"}`;
      if (s.purpose) label += ` (${s.purpose})`;
      if (s.kind === "decide") label += `: ${s.name} → ${s.choice}`;
      label += timed ? `, ${lats[i].toFixed(3)} s` : "";
      svg.appendChild(el("rect", { x, y: top + j * laneH + 2, width: w, height: laneH - 5, rx: 2,
                                   fill: kindColor(s.kind) }, title(label)));
      if (s.kind === "decide" && typeof s.choice === "string" && x - lastLabel > 48) {
        const end = x > W - right - 50;
        svg.appendChild(el("text", { x: end ? Math.min(x + w, W - right) : x + 1, y: top - 5,
                                     "text-anchor": end ? "end" : "start" }, s.choice.slice(0, 9)));
        lastLabel = x;
      }
      t += d;
    });
    svg.appendChild(el("text", { x: W - right, y: H - 4, "text-anchor": "end" },
                       timed ? `${total.toFixed(2)} s in all` : `${steps.length} steps (no latency recorded)`));
    return svg;
  }

  // EvoCtx (Chen et al., 2026, §3.2): d_near, d_cent and d_90 of each round's reasoning trace to the
  // knowledge boundary against the thresholds τ (dashed), and the signed margin (RETRIEVE above 0),
  // with the oracle margin where the run recorded it.
  function evoctx(decisions, thresholds) {
    const W = 440, H = 260, left = 40, right = 96, top = 14, mid = 130, bottom = 230;
    const svg = frame("chart-evoctx", W, H, "EvoCtx trajectory: distances to the boundary by round");
    const n = decisions.length;
    const xs = (i) => left + (n === 1 ? (W - left - right) / 2 : (i * (W - left - right)) / (n - 1));
    const series = [["d_near", "#2f7dd1", "tau_near"], ["d_cent", "#c23b6c", "tau_cent"], ["d_90", "#1f9d6b", "tau_90"]];
    const values = decisions.flatMap((d) => series.map(([k]) => num(d.signals[k])));
    const taus = series.map(([, , t]) => thresholds[t]).filter((v) => typeof v === "number");
    const maxD = Math.max(0.5, ...values, ...taus) * 1.1;
    const yD = (v) => mid - 10 - (v / maxD) * (mid - 10 - top);
    svg.appendChild(el("text", { x: W - right + 4, y: top + 8 }, "distance"));
    svg.appendChild(el("text", { x: left - 4, y: yD(maxD / 1.1) + 4, "text-anchor": "end" }, fmt(maxD / 1.1)));
    svg.appendChild(el("text", { x: left - 4, y: yD(0) + 4, "text-anchor": "end" }, "0"));
    svg.appendChild(el("line", { x1: left, x2: W - right, y1: yD(0), y2: yD(0), stroke: "#999" }));
    series.forEach(([k, color, tk], j) => {
      const tau = thresholds[tk];
      if (typeof tau === "number") {
        svg.appendChild(el("line", { x1: left, x2: W - right, y1: yD(tau), y2: yD(tau), stroke: color,
                                     "stroke-dasharray": "5 4", opacity: 0.8 }, title(`${tk} = ${tau}`)));
        svg.appendChild(el("text", { x: W - right + 4, y: yD(tau) + 3, fill: color }, `τ ${k.slice(2)} ${tau}`));
      }
      const pts = decisions.map((d, i) => `${xs(i)},${yD(num(d.signals[k]))}`).join(" ");
      svg.appendChild(el("polyline", { points: pts, fill: "none", stroke: color, "stroke-width": 2 }));
      decisions.forEach((d, i) => svg.appendChild(el("circle", { cx: xs(i), cy: yD(num(d.signals[k])), r: 3, fill: color },
        title(`round ${d.signals.round ?? i + 1}: ${k} = ${num(d.signals[k]).toFixed(3)}`))));
      svg.appendChild(el("text", { x: left + 6 + j * 56, y: mid + 4, fill: color }, k));
    });
    // margin panel
    const margins = decisions.flatMap((d) => [num(d.signals.margin), num(d.signals.oracle_margin)]);
    const maxM = Math.max(0.5, ...margins.map(Math.abs)) * 1.1;
    const yM = (v) => (mid + 20 + bottom) / 2 - (v / maxM) * ((bottom - mid - 20) / 2);
    svg.appendChild(el("text", { x: left - 4, y: yM(maxM / 1.1) + 4, "text-anchor": "end" }, fmt(maxM / 1.1)));
    svg.appendChild(el("text", { x: left - 4, y: yM(0) + 4, "text-anchor": "end" }, "0"));
    svg.appendChild(el("line", { x1: left, x2: W - right, y1: yM(0), y2: yM(0), stroke: "#999", "stroke-dasharray": "3 3" }));
    svg.appendChild(el("text", { x: W - right + 4, y: yM(0) - 4 }, "↑ RETRIEVE"));
    svg.appendChild(el("text", { x: W - right + 4, y: yM(0) + 12 }, "↓ THINK"));
    const line = (key, color) => {
      const have = decisions.map((d, i) => [i, d.signals[key]]).filter(([, v]) => typeof v === "number");
      if (!have.length) return;
      svg.appendChild(el("polyline", { points: have.map(([i, v]) => `${xs(i)},${yM(v)}`).join(" "), fill: "none",
                                       stroke: color, "stroke-width": 2 }));
      have.forEach(([i, v]) => svg.appendChild(el("circle", { cx: xs(i), cy: yM(v), r: 3, fill: color },
        title(`round ${decisions[i].signals.round ?? i + 1}: ${key} = ${v.toFixed(3)}`))));
    };
    line("margin", "#333d4c");
    line("oracle_margin", "#c07a12");
    svg.appendChild(el("text", { x: W - right + 4, y: bottom - 8, fill: "#333d4c" }, "margin"));
    if (decisions.some((d) => typeof d.signals.oracle_margin === "number"))
      svg.appendChild(el("text", { x: W - right + 4, y: bottom + 6, fill: "#c07a12" }, "oracle margin"));
    decisions.forEach((d, i) => {
      svg.appendChild(el("text", { x: xs(i), y: H - 4, "text-anchor": "middle" },
                         `r${d.signals.round ?? i + 1} ${String(d.choice || "").slice(0, 8)}`));
    });
    return svg;
  }

  return { costPerStep, timeline, evoctx, kindColor };
})();
