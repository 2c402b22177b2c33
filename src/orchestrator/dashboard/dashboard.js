// iota dashboard: polls the orchestrator's public JSON endpoints and draws SVG plots.
"use strict";

const NS = "http://www.w3.org/2000/svg";
const REFRESH_MS = 2000;
const errors = [];

window.addEventListener("error", (e) => report(e.message || String(e)));
window.addEventListener("unhandledrejection", (e) => report(String(e.reason)));

function report(message) {
  errors.push(message);
  document.getElementById("errors").textContent = errors.slice(-5).join("\n");
}

async function getJson(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) return null;
  return r.json();
}

function el(tag, attrs, text) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

function svgEl(tag, attrs) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  return node;
}

function short(hotkey) {
  return hotkey.length > 12 ? hotkey.slice(0, 6) + "…" + hotkey.slice(-4) : hotkey;
}

function fmt(x, digits) {
  return x === null || x === undefined || Number.isNaN(x) ? "-" : Number(x).toFixed(digits);
}

// A line chart of series [{points: [[x, y]...], color, width, dots, name}] with axes.
function lineChart(svg, series, xLabel) {
  svg.replaceChildren();
  const W = 640, H = svg.viewBox.baseVal.height || 240, L = 48, R = 10, T = 10, B = 28;
  const all = series.flatMap((s) => s.points);
  if (all.length === 0) {
    const t = svgEl("text", { x: W / 2, y: H / 2, "text-anchor": "middle" });
    t.textContent = "no data yet";
    svg.appendChild(t);
    return;
  }
  let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...all.map((p) => p[1])), Math.max(...all.map((p) => p[1]))];
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y0 -= 0.5; y1 += 0.5; }
  const pad = (y1 - y0) * 0.05; y0 -= pad; y1 += pad;
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const y = y0 + ((y1 - y0) * i) / 4;
    svg.appendChild(svgEl("line", { x1: L, x2: W - R, y1: sy(y), y2: sy(y), stroke: "#2b3640" }));
    const t = svgEl("text", { x: L - 4, y: sy(y) + 4, "text-anchor": "end" });
    t.textContent = fmt(y, y1 - y0 < 10 ? 2 : 0);
    svg.appendChild(t);
  }
  const xl = svgEl("text", { x: W - R, y: H - 6, "text-anchor": "end" });
  xl.textContent = xLabel + " " + fmt(x0, 0) + " … " + fmt(x1, 0);
  svg.appendChild(xl);
  for (const s of series) {
    if (s.points.length === 0) continue;
    const d = s.points.map((p, i) => (i ? "L" : "M") + sx(p[0]).toFixed(1) + " " + sy(p[1]).toFixed(1)).join(" ");
    svg.appendChild(svgEl("path", { d, fill: "none", stroke: s.color, "stroke-width": s.width || 1.5, "data-series": s.name || "" }));
    if (s.dots) {
      for (const p of s.points) {
        svg.appendChild(svgEl("circle", { cx: sx(p[0]), cy: sy(p[1]), r: 3.5, fill: s.color }));
      }
    }
  }
}

// Exponential moving average of the loss points, for a readable curve.
function smooth(points, alpha) {
  let m = null;
  return points.map(([x, y]) => { m = m === null ? y : alpha * y + (1 - alpha) * m; return [x, m]; });
}

function drawLoss(history, merge) {
  const raw = history ? history.points.map((p) => [p.sample, p.loss]) : [];
  const epochs = merge ? merge.epochs : [];
  // Epoch means sit at the last sample of their epoch; an epoch's eval loss (of the model it
  // started from) at its first sample.
  const lastOf = {}, firstOf = {};
  for (const p of history ? history.points : []) {
    lastOf[p.epoch] = Math.max(lastOf[p.epoch] ?? p.sample, p.sample);
    firstOf[p.epoch] = Math.min(firstOf[p.epoch] ?? p.sample, p.sample);
  }
  const means = epochs.filter((e) => e.mean_loss !== null && lastOf[e.epoch] !== undefined)
    .map((e) => [lastOf[e.epoch], e.mean_loss]);
  const evals = epochs.filter((e) => e.eval_loss !== undefined && e.eval_loss !== null && firstOf[e.epoch] !== undefined)
    .map((e) => [firstOf[e.epoch], e.eval_loss]);
  lineChart(document.getElementById("loss-chart"), [
    { points: raw, color: "#4fb3ff33", width: 1, name: "loss" },
    { points: smooth(raw, 0.1), color: "#4fb3ff", width: 2, name: "loss-smoothed" },
    { points: means, color: "#d29922", width: 1, dots: true, name: "epoch-mean" },
    { points: evals, color: "#c678dd", width: 2, dots: true, name: "eval" },
  ], "sample");
}

function drawThroughput(history) {
  const pts = history ? history.points : [];
  const buckets = new Map();
  for (const p of pts) {
    const b = Math.floor(p.finished_ms / 10000);
    buckets.set(b, (buckets.get(b) || 0) + 1);
  }
  const keys = [...buckets.keys()].sort((a, b) => a - b);
  const t0 = keys.length ? keys[0] : 0;
  const series = keys.map((k) => [(k - t0) * 10, (buckets.get(k) * history.tokens_per_sample) / 10]);
  lineChart(document.getElementById("tps-chart"), [{ points: series, color: "#3fb950", width: 2, dots: true }], "seconds");
}

function drawMiners(status, scores) {
  const box = document.getElementById("miners");
  box.replaceChildren();
  for (const s of status.sections) {
    const card = el("div", { class: "section" });
    card.appendChild(el("h3", {}, `section ${s.index} · blocks ${s.blocks[0]}..${s.blocks[1]} · ${s.miners.length} miner(s)`));
    if (s.miners.length === 0) card.appendChild(el("div", { class: "empty" }, "no miner"));
    for (const m of s.miners) {
      const row = el("div", { class: "miner", "data-hotkey": m.hotkey, title: m.hotkey });
      const state = m.last_seen_s < 15 ? "active" : m.last_seen_s < 120 ? "stale" : "gone";
      row.appendChild(el("span", { class: "dot " + state, title: state + ", seen " + fmt(m.last_seen_s, 0) + " s ago" }));
      row.appendChild(el("span", { class: "mono" }, short(m.hotkey)));
      const w = scores.weight.get(m.hotkey);
      const sc = scores.score.get(m.hotkey);
      const score = (w !== undefined ? ` · weight ${fmt(w, 3)}` : "") +
        (sc !== undefined ? ` · score ${fmt(sc.reduce((a, b) => a + b, 0) / sc.length, 3)}` : "");
      row.appendChild(el("span", {}, `fwd ${m.forwards} · bwd ${m.backwards} · pen ${m.penalties} · w${m.weights_epoch}${score}`));
      card.appendChild(row);
    }
    box.appendChild(card);
  }
}

function drawWork(status) {
  const svg = document.getElementById("work-chart");
  svg.replaceChildren();
  const miners = status.sections.flatMap((s) => s.miners.map((m) => ({ ...m, section: s.index })));
  if (miners.length === 0) return;
  const W = 640, H = 200, B = 40, max = Math.max(1, ...miners.map((m) => m.backwards));
  const w = (W - 20) / miners.length;
  const colors = ["#4fb3ff", "#3fb950", "#d29922", "#c678dd", "#f85149"];
  miners.forEach((m, i) => {
    const h = ((H - B - 10) * m.backwards) / max;
    svg.appendChild(svgEl("rect", { x: 10 + i * w + 2, y: H - B - h, width: Math.max(1, w - 4), height: h, fill: colors[m.section % colors.length] }));
    const t = svgEl("text", { x: 10 + i * w + w / 2, y: H - B + 14, "text-anchor": "middle" });
    t.textContent = "s" + m.section;
    svg.appendChild(t);
    const v = svgEl("text", { x: 10 + i * w + w / 2, y: H - B - h - 3, "text-anchor": "middle" });
    v.textContent = m.backwards;
    svg.appendChild(v);
  });
}

function drawMerges(merge) {
  const box = document.getElementById("merges");
  box.replaceChildren();
  if (!merge) { box.appendChild(el("div", { class: "empty" }, "merge status unavailable")); return; }
  const t = el("table");
  t.appendChild(el("tr")).append(...["section", "uploads", "partitions", "results", "finalized", "recomputed", "fallbacks", "flagged"].map((h) => el("th", {}, h)));
  for (const s of merge.sections) {
    const flagged = s.flagged.map((f) => `${short(f.hotkey)} p${f.partition} ${f.reason}`).join(", ");
    t.appendChild(el("tr")).append(
      el("td", {}, String(s.section)), el("td", {}, String(s.uploads)), el("td", {}, String(s.partitions)),
      el("td", {}, String(s.results)), el("td", {}, s.finalized ? "yes" : "no"), el("td", {}, String(s.recomputed)),
      el("td", {}, String(s.fallbacks)), el("td", { title: flagged }, flagged ? String(s.flagged.length) : "0"));
  }
  box.appendChild(el("div", { class: "kpi" }, `op ${merge.op} · merge every ${merge.batches_before_merging} samples · ${merge.epochs.length} epoch(s)`));
  box.appendChild(t);
  if (merge.epochs.length) {
    const e = el("table");
    e.appendChild(el("tr")).append(...["epoch", "samples", "mean loss", "first ¼", "last ¼", "eval"].map((h) => el("th", {}, h)));
    for (const ep of merge.epochs) {
      e.appendChild(el("tr")).append(el("td", {}, String(ep.epoch)), el("td", {}, String(ep.completed)),
        el("td", {}, fmt(ep.mean_loss, 4)), el("td", {}, fmt(ep.first_loss, 4)), el("td", {}, fmt(ep.last_loss, 4)),
        el("td", {}, fmt(ep.eval_loss, 4)));
    }
    box.appendChild(e);
  }
}

// Partition verdicts of every finished section merge as stacked bars, flags on top.
function drawMergeHistory(history) {
  const svg = document.getElementById("merge-history");
  svg.replaceChildren();
  const merges = history && history.merges ? history.merges : [];
  if (merges.length === 0) {
    const t = svgEl("text", { x: 320, y: 80, "text-anchor": "middle" });
    t.textContent = "no merge finished yet";
    svg.appendChild(t);
    return;
  }
  const W = 640, H = 160, B = 28, T = 16;
  const kinds = [["agreed", "#3fb950"], ["single", "#4fb3ff"], ["recomputed", "#d29922"], ["fallback", "#f85149"]];
  const total = (m) => kinds.reduce((n, [k]) => n + m[k], 0);
  const max = Math.max(1, ...merges.map(total));
  const w = (W - 20) / merges.length;
  merges.forEach((m, i) => {
    let y = H - B;
    const g = svgEl("g", { "data-merge": `${m.epoch}/${m.section}` });
    const detail = kinds.map(([k]) => `${k} ${m[k]}`).join(", ");
    const flags = m.flags.map(([hotkey, p, reason]) => `${short(hotkey)} p${p} ${reason}`).join("; ");
    const tip = svgEl("title", {});
    tip.textContent = `epoch ${m.epoch} section ${m.section}: ${detail}` + (flags ? ` · flagged: ${flags}` : "");
    g.appendChild(tip);
    for (const [k, color] of kinds) {
      const h = ((H - B - T) * m[k]) / max;
      if (h > 0) g.appendChild(svgEl("rect", { x: 10 + i * w + 1, y: y - h, width: Math.max(1, w - 2), height: h, fill: color }));
      y -= h;
    }
    if (m.flags.length) {
      const f = svgEl("text", { x: 10 + i * w + w / 2, y: y - 3, "text-anchor": "middle", fill: "#f85149" });
      f.textContent = "⚑" + m.flags.length;
      g.appendChild(f);
    }
    svg.appendChild(g);
    if (merges.length <= 24 || i % Math.ceil(merges.length / 24) === 0) {
      const t = svgEl("text", { x: 10 + i * w + w / 2, y: H - B + 14, "text-anchor": "middle" });
      t.textContent = `e${m.epoch}s${m.section}`;
      svg.appendChild(t);
    }
  });
}

function drawWeights(weights) {
  const box = document.getElementById("weights");
  box.replaceChildren();
  const combined = weights && weights.combined ? weights.combined : [];
  if (combined.length === 0) {
    box.appendChild(el("div", { class: "empty" }, "no validator has published weights yet"));
    return;
  }
  const svg = svgEl("svg", { width: "100%", height: 24 * combined.length + 10, viewBox: `0 0 640 ${24 * combined.length + 10}` });
  const max = Math.max(...combined.map((c) => c[1]), 1e-9);
  combined.forEach(([hotkey, w], i) => {
    const label = svgEl("text", { x: 0, y: 24 * i + 16 });
    label.textContent = short(hotkey);
    svg.appendChild(label);
    svg.appendChild(svgEl("rect", { x: 110, y: 24 * i + 5, width: (470 * w) / max, height: 16, fill: "#4fb3ff" }));
    const v = svgEl("text", { x: 115 + (470 * w) / max, y: 24 * i + 16 });
    v.textContent = fmt(w, 3);
    svg.appendChild(v);
  });
  box.appendChild(el("div", { class: "kpi" }, `${weights.validators.length} validator(s), combined by ${weights.combine}, burn ${fmt(weights.combined_burn, 3)}`));
  box.appendChild(svg);
}

// Text the orchestrator sampled from the newest merged model, one block per prompt.
function drawSamples(samples) {
  const box = document.getElementById("samples");
  box.replaceChildren();
  const latest = samples ? samples.latest : null;
  if (samples && samples.error) box.appendChild(el("div", { class: "kpi" }, "last attempt failed: " + samples.error));
  if (!latest) {
    box.appendChild(el("div", { class: "empty" }, "no merged model sampled yet"));
    return;
  }
  box.appendChild(el("div", { class: "kpi" },
    `model after epoch ${latest.epoch}, sampled ${new Date(latest.generated_ms).toLocaleTimeString()} in ${fmt(latest.seconds, 1)} s`));
  for (const s of latest.samples) {
    const p = el("p", { class: "sample mono" });
    p.appendChild(el("b", {}, s.prompt));
    p.appendChild(document.createTextNode(s.text));
    box.appendChild(p);
  }
}

// Runs on a chain only: each miner's uid and incentive, each validator's stake, the block of
// its last weights on chain (set or committed) and the largest of the weights the chain holds
// for it (uid: share of the sum), from the orchestrator's last metagraph read.
// A validator's largest weights on chain, "uid: share", and how many more.
function chainWeights(n) {
  const top = n.weights || [];
  if (!top.length) return n.validator_permit ? "none" : "";
  let cell = top.map(([uid, share]) => `${uid}: ${fmt(share, 3)}`).join(", ");
  if (n.weights_count > top.length) cell += ` (+${n.weights_count - top.length} more)`;
  return cell;
}

function drawChain(chain) {
  const card = document.getElementById("chain-card");
  if (!chain) {
    card.hidden = true;
    return;
  }
  card.hidden = false;
  const box = document.getElementById("chain");
  box.replaceChildren();
  const age = Math.max(0, (Date.now() - chain.refreshed_unix_ms) / 1000);
  let head = `subnet ${chain.netuid} on ${chain.network}, metagraph of block ${chain.block} (read ${fmt(age, 0)} s ago)`;
  if (chain.error) head += `; the last refresh failed: ${chain.error}`;
  box.appendChild(el("div", { class: "kpi" }, head));
  const table = el("table", { class: "mono" });
  const header = el("tr");
  for (const h of ["uid", "role", "hotkey", "stake (TAO)", "incentive", "last weights (block)", "weights on chain (uid: share)"]) header.appendChild(el("th", {}, h));
  table.appendChild(header);
  for (const n of chain.neurons.filter((n) => n.miner || n.validator_permit)) {
    const row = el("tr");
    const role = n.miner ? (n.validator_permit ? "miner+validator" : "miner") : "validator";
    for (const cell of [n.uid, role, short(n.hotkey), fmt(n.stake_tao, 3), fmt(n.incentive, 4), n.last_update ? n.last_update : "never", chainWeights(n)]) {
      row.appendChild(el("td", {}, String(cell)));
    }
    table.appendChild(row);
  }
  box.appendChild(table);
}

function drawHeader(status, merge) {
  document.getElementById("run").textContent = status.run;
  const phase = document.getElementById("phase");
  phase.textContent = status.phase;
  phase.className = "badge " + status.phase;
  document.getElementById("epoch").textContent = status.epoch;
  document.getElementById("completed").textContent = status.samples.completed;
  document.getElementById("dropped").textContent = status.samples.dropped;
  document.getElementById("inflight").textContent = status.samples.in_flight;
  document.getElementById("loss").textContent = fmt(status.recent_loss, 4);
  document.getElementById("eval").textContent = fmt(status.eval_loss, 4);
  document.getElementById("tps").textContent = fmt(status.tokens_per_s, 0);
  let next = "";
  if (status.phase_deadline_unix_ms) {
    next = `deadline in ${fmt(Math.max(0, status.phase_deadline_unix_ms - Date.now()) / 1000, 0)} s`;
  } else if (merge) {
    const cur = merge.epochs.find((e) => e.epoch === status.epoch);
    next = `merge in ${Math.max(0, merge.batches_before_merging - (cur ? cur.completed : 0))} samples`;
  }
  document.getElementById("next").textContent = next;
  document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
}

async function refresh() {
  try {
    const [status, merge, history, weights, samples] = await Promise.all([
      getJson("/api/status"), getJson("/api/merge/status"), getJson("/api/history"), getJson("/api/weights"),
      getJson("/api/samples"),
    ]);
    if (!status) throw new Error("/api/status did not answer");
    // Combined published weight, and each validator's score of the miner (averaged).
    const scores = { weight: new Map(weights && weights.combined ? weights.combined : []), score: new Map() };
    for (const v of weights && weights.validators ? weights.validators : []) {
      for (const mw of v.weights || []) {
        if (!mw.parts || typeof mw.parts.score !== "number") continue;
        if (!scores.score.has(mw.hotkey)) scores.score.set(mw.hotkey, []);
        scores.score.get(mw.hotkey).push(mw.parts.score);
      }
    }
    drawHeader(status, merge);
    drawLoss(history, merge);
    drawThroughput(history);
    drawMiners(status, scores);
    drawWork(status);
    drawMerges(merge);
    drawMergeHistory(history);
    drawWeights(weights);
    drawSamples(samples);
    drawChain(status.chain);
    document.body.dataset.ready = "1";
  } catch (e) {
    report("refresh failed: " + e.message);
  }
}

refresh();
setInterval(refresh, REFRESH_MS);
