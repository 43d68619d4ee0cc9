// The corral dashboard: draws the board the server sends on /events (server-sent events) and a
// job's timeline from /api/jobs/<id>. Nothing here decides what may be seen: the server asks the
// read service as one identity and sends only what its answers hold. Text goes in as text, never
// as markup.
"use strict";

const $ = (sel) => document.querySelector(sel);

// The dashboard's key, from the address it printed: every question to it carries it.
const KEY = new URLSearchParams(location.search).get("key") || "";
const keyed = (path) => (KEY ? `${path}?key=${encodeURIComponent(KEY)}` : path);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "style") Object.assign(e.style, v);
    else if (k === "dataset") Object.assign(e.dataset, v);
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function when(t) {
  return t ? new Date(t * 1000).toISOString().slice(11, 19) : "–";
}

let selected = decodeURIComponent(location.hash.replace(/^#job=/, "")) || null;
let timelineSeq = -1;
let lastSeq = -1;

function setStatus(text, live) {
  const s = $("#status");
  s.textContent = text;
  s.className = "status " + (live ? "live" : "offline");
}

function render(msg) {
  const b = msg.board;
  if (msg.problem) setStatus("stale: " + msg.problem, false);
  else if (b) setStatus("live", true);
  if (!b) return;
  $("#asker").textContent = b.asker;
  $("#seq").textContent = b.seq;
  drawLegend(b);
  drawGrid(b);
  drawQueues(b);
  drawJobs(b);
  lastSeq = b.seq;
  if (selected && b.seq !== timelineSeq) loadJob(selected);
}

function drawLegend(b) {
  const seen = new Map(b.queues.map((q) => [q.queue, q.colour]));
  const items = [...seen].map(([q, c]) =>
    el("span", { dataset: { queue: q } }, el("span", { class: "swatch", style: { background: c } }), q));
  items.push(el("span", {}, el("span", { class: "swatch", style: { background: "#9aa0a6" } }), "others' jobs"));
  items.push(el("span", {}, el("span", { class: "swatch", style: { background: "#fff" } }), "free"));
  items.push(el("span", {}, el("span", { class: "swatch unavailable" }), "not available"));
  items.push(el("span", {}, el("span", { class: "swatch unhealthy" }), "unhealthy"));
  $("#legend").replaceChildren(...items);
}

function drawGrid(b) {
  const nodes = b.nodes.map((n) => {
    const gpus = n.gpus.map((g) => {
      const segs = g.segments.map((s) =>
        el("div", {
          class: "seg",
          dataset: { job: s.job, queue: s.queue },
          style: {
            flexGrow: String(s.share), flexBasis: "0", background: s.colour,
            boxShadow: `inset 0 -5px 0 rgba(0,0,0,${0.08 + 0.09 * s.tint})`,
          },
          onclick: s.job ? () => select(s.job) : undefined,
        }, s.job));
      if (g.free > 0) segs.push(el("div", { class: "seg free", style: { flexGrow: String(g.free), flexBasis: "0" } }));
      // Idle, but no work may go on it (its node takes none, or the GPU is unhealthy): never drawn as free.
      if (g.unavailable > 0) {
        segs.push(el("div", {
          class: "seg unavailable", dataset: { why: g.unavailable_why },
          style: { flexGrow: String(g.unavailable), flexBasis: "0" },
        }));
      }
      return el("div", {
        class: "gpu" + (g.healthy ? "" : " unhealthy"),
        title: g.title,
        dataset: { gpu: g.id, healthy: String(g.healthy) },
      }, ...segs, el("span", { class: "idx" }, g.index));
    });
    return el("div", { class: "node", dataset: { node: n.name, health: n.health } },
      el("div", { class: "node-head" },
        el("span", { class: "node-name" }, n.name),
        el("span", { class: "profile note" }, n.profile),
        el("span", { class: "health" }, n.health)),
      el("div", { class: "gpus" }, ...gpus));
  });
  $("#grid").replaceChildren(...nodes);
}

function drawQueues(b) {
  const num = ["nominal", "used", "borrowed", "lent", "pending", "admitted"];
  const rows = b.queues.map((q) => el("tr", { dataset: { queue: q.queue, gpu: q.gpu } },
    el("td", { class: "queue" }, el("span", { class: "swatch", style: { background: q.colour } }), q.queue),
    el("td", { class: "cohort" }, q.cohort),
    el("td", { class: "gpu-key" }, q.gpu),
    ...num.map((f) => el("td", { class: "num " + f }, q[f]))));
  $("#queues tbody").replaceChildren(...rows);
}

function jobRow(j, ...last) {
  return el("tr", { dataset: { job: j.id }, class: j.id === selected ? "selected" : "", onclick: () => select(j.id) },
    el("td", { class: "id" }, j.id),
    el("td", { class: "queue" }, el("span", { class: "swatch", style: { background: j.colour } }), j.queue),
    el("td", { class: "phase" }, j.phase),
    el("td", { class: "num attempt" }, j.attempt),
    el("td", { class: "wants" }, j.wants),
    ...last);
}

// A waiting job's forecast start, in how long from now, and its band (what `corral jobs` shows).
function span(s) {
  if (s < 60) return s > 0 ? "< 1 min" : "now";
  if (s < 5400) return `${Math.round(s / 60)} min`;
  if (s < 2 * 86400) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

function starts(eta) {
  if (!eta) return "–";
  if (eta.start === null) return `not within ${eta.horizon_s / 3600} h`;
  const now = Date.now() / 1000;
  const late = eta.late === null ? "beyond the horizon" : span(eta.late - now);
  return `in ${span(eta.start - now)} (${span(eta.early - now)} to ${late})`;
}

function drawJobs(b) {
  $("#waiting tbody").replaceChildren(...b.waiting.map((j) =>
    jobRow(j, el("td", { class: "starts" }, starts(j.eta)), el("td", { class: "reason" }, j.reason || "–"))));
  $("#running tbody").replaceChildren(...b.running.map((j) => jobRow(j, el("td", { class: "nodes" }, j.nodes))));
  $("#waiting-count").textContent = `(${b.waiting.length})`;
  $("#running-count").textContent = `(${b.running.length})`;
  $("#finished").textContent = b.finished ? `${b.finished} finished jobs kept` : "";
}

function select(job) {
  selected = job;
  history.replaceState(null, "", "#job=" + encodeURIComponent(job));
  timelineSeq = -1;
  loadJob(job);
  document.querySelectorAll("tr.selected").forEach((r) => r.classList.remove("selected"));
  document.querySelectorAll(`tr[data-job="${CSS.escape(job)}"]`).forEach((r) => r.classList.add("selected"));
}

async function loadJob(job) {
  const asked = lastSeq;
  timelineSeq = asked;
  let t;
  try {
    const r = await fetch(keyed("/api/jobs/" + encodeURIComponent(job)));
    t = await r.json();
  } catch (e) {
    timelineSeq = -1;
    return;
  }
  if (job !== selected) return;
  drawTimeline(job, t);
}

function drawTimeline(job, t) {
  $("#job").hidden = false;
  $("#job-id").textContent = job;
  if (t.error) {
    $("#job-line").textContent = t.error;
    $("#job-reasons").replaceChildren();
    $("#job-counts").textContent = "";
    $("#timeline").replaceChildren();
    return;
  }
  const j = t.job;
  $("#job-line").textContent =
    `${j.tenant}'s job in queue ${j.queue}: ${j.phase} (attempt ${j.attempt}), ${j.wants}` +
    (j.nodes ? ` on ${j.nodes}` : j.where ? `, ${j.where}` : "");
  $("#job-reasons").replaceChildren(...t.reasons.map((r) =>
    el("li", { class: "why", dataset: { code: r.code } },
      `[${r.code}] ${r.message}${r.preemption_helps ? " (preemption could help)" : ""}`)));
  const c = t.counts;
  $("#job-counts").textContent =
    `${t.attempts.length} attempt(s), ${c.placed} placement(s), ${c.preempted} preemption(s), ${c.checkpoint} checkpoint(s)`;
  const times = t.attempts.flatMap((a) => a.events.map((e) => e.time)).filter((x) => x);
  const t0 = Math.min(...times), t1 = Math.max(...times);
  const span = t1 > t0 ? t1 - t0 : 1;
  const attempts = t.attempts.map((a) => {
    const marks = a.events.filter((e) => e.time && !e.refused).map((e) =>
      el("span", { class: "mark", dataset: { kind: e.kind }, title: `${when(e.time)} ${e.summary}`,
        style: { left: `${(100 * (e.time - t0)) / span}%` } }));
    const events = a.rows.map((e) =>
      el("li", { class: "ev" + (e.refused ? " refused" : ""), dataset: { kind: e.kind, seq: String(e.seq) } },
        el("span", { class: "when" }, `${when(e.time)} #${e.seq}`),
        el("span", { class: "kind" }, e.kind),
        el("span", { class: "summary" }, e.summary + (e.refused ? ` (refused: ${e.refused})` : ""))));
    return el("div", { class: "attempt", dataset: { attempt: String(a.attempt) } },
      el("div", { class: "attempt-head" }, `attempt ${a.attempt}` + (a.events.length ? "" : " (not begun)")),
      el("div", { class: "track" }, ...marks),
      el("ol", { class: "events" }, ...events));
  });
  $("#timeline").replaceChildren(...attempts);
}

$("#job-close").addEventListener("click", () => {
  selected = null;
  history.replaceState(null, "", location.pathname + location.search);
  $("#job").hidden = true;
});

function connect() {
  const es = new EventSource(keyed("/events"));
  es.addEventListener("board", (m) => render(JSON.parse(m.data)));
  es.onerror = () => setStatus("reconnecting…", false);
}

// A link to a job (#job=<id>) opens its timeline, also when only the address's fragment changes.
window.addEventListener("hashchange", () => {
  const job = decodeURIComponent(location.hash.replace(/^#job=/, ""));
  if (job && job !== selected) select(job);
});

if (selected) select(selected);
connect();
