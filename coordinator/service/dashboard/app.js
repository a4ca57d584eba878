// cutline's dashboard: polls the coordinator worker's JSON views every second and redraws.
// Plain JavaScript with no build step and no CDN, so the page works offline. The charts are
// drawn as inline SVG by hand: two bar charts do not justify shipping a chart library.
"use strict";

const POLL_MS = 1000;
const $ = (selector) => document.querySelector(selector);

function el(tag, attributes = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attributes)) {
    if (key === "class") node.className = value;
    else node.setAttribute(key, value);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

function formatTime(ms) {
  if (ms === null || ms === undefined) return "-";
  return new Date(ms).toISOString().replace("T", " ").replace("Z", "");
}

function formatBytes(n) {
  if (n === null || n === undefined) return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n, unit = 0;
  while (Math.abs(value) >= 1024 && unit < units.length - 1) { value /= 1024; unit++; }
  return unit === 0 ? `${n} B` : `${value.toFixed(1)} ${units[unit]}`;
}

const formatMs = (ms) => (ms === null || ms === undefined ? "-" : `${ms} ms`);

// A JSON view and the worker that answered for the job (a job's views on another worker than its
// owner are the owner's: the Cutline-Owner header names it).
async function getJsonFrom(path) {
  const response = await fetch(path, { cache: "no-store" });
  if (!response.ok) {
    const why = await response.json().then((body) => body.errors?.[0], () => undefined);
    throw new Error(`${path}: HTTP ${response.status}${why ? `: ${why}` : ""}`);
  }
  return { body: await response.json(), owner: response.headers.get("Cutline-Owner") };
}

async function getJson(path) {
  return (await getJsonFrom(path)).body;
}

// A worker's web address: a link to another worker only when the coordinator says it may be one
// (an http(s) URL: a member of the group could advertise javascript:), plain text otherwise.
function workerAddress(url, link, self) {
  if (url === self) return el("span", {}, url, " (this worker)");
  return link ? el("a", { href: link }, url) : el("span", {}, url ?? "-");
}

function status(text) {
  return el("span", { class: `status-${text}` }, text ?? "-");
}

function route() {
  const match = location.hash.match(/^#\/jobs\/(.+)$/);
  return match ? { page: "job", job: decodeURIComponent(match[1]) } : { page: "jobs" };
}

async function renderJobs() {
  const { jobs, unreachable, self } = await getJson("/jobs");
  const body = $("#jobs tbody");
  body.replaceChildren(
    ...jobs.map((job) => {
      const counts = job.counts || {};
      const last = job.last_completed;
      return el(
        "tr",
        { "data-job": job.id },
        el("td", {}, el("a", { href: `#/jobs/${encodeURIComponent(job.id)}` }, job.id)),
        el("td", {}, status(job.status)),
        el("td", { class: "num" }, job.attempt),
        el("td", { class: "num" }, job.restarts ?? 0),
        el("td", {}, last ? `${last.id} at ${formatTime(last.timestamp)}` : "-"),
        el("td", { class: "num completed" }, counts.completed ?? 0),
        el("td", { class: "num in-progress" }, counts.in_progress ?? 0),
        el("td", { class: "num failed" }, counts.failed ?? 0),
        el("td", { class: "owner" }, workerAddress(job.owner, job.owner_link, self)),
      );
    }),
  );
  $("#no-jobs").hidden = jobs.length > 0;
  $("#unreachable").hidden = !unreachable?.length;
  $("#unreachable").replaceChildren(
    ...(unreachable ?? []).map((peer) =>
      el("li", { "data-worker": peer.url }, "worker ", workerAddress(peer.url, peer.link, self),
        ` not asked or no answer (${peer.reason}): its jobs are missing`),
    ),
  );
  const { workers } = await getJson("/workers");
  $("#worker").textContent = `worker ${self}`;
  $("#workers").replaceChildren(
    ...workers.map((worker) =>
      el(
        "li",
        {},
        workerAddress(worker.url, worker.link, self),
        worker.partitions.length ? ` · journal partitions ${worker.partitions.join(", ")}` : "",
      ),
    ),
  );
}

function card(label, value, cls) {
  return el("div", { class: `card ${cls}` }, el("b", {}, value), label);
}

function latestRow(label, entry) {
  if (!entry) return el("tr", {}, el("th", {}, label), el("td", { colspan: 3 }, "none"));
  const detail = entry.failure_message || entry.external_path || "";
  return el(
    "tr",
    {},
    el("th", {}, label),
    el("td", {}, `#${entry.id}`),
    el("td", {}, formatTime(entry.trigger_timestamp ?? entry.restore_timestamp)),
    el("td", { class: "wrap" }, detail),
  );
}

function barChart(svg, values, format) {
  const width = 600, height = 160, left = 56, bottom = 18, top = 8;
  svg.replaceChildren();
  const ns = "http://www.w3.org/2000/svg";
  const add = (tag, attributes, text) => {
    const node = document.createElementNS(ns, tag);
    for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
    if (text !== undefined) node.textContent = text;
    svg.append(node);
    return node;
  };
  add("line", { class: "axis", x1: left, y1: height - bottom, x2: width, y2: height - bottom });
  if (!values.length) {
    add("text", { x: left + 8, y: height / 2 }, "no completed checkpoint yet");
    return;
  }
  const max = Math.max(...values, 1);
  const slot = (width - left) / values.length;
  values.forEach((value, i) => {
    const h = ((height - bottom - top) * value) / max;
    const bar = add("rect", {
      class: "bar",
      x: left + i * slot + slot * 0.1,
      y: height - bottom - h,
      width: Math.max(1, slot * 0.8),
      height: h,
    });
    const title = document.createElementNS(ns, "title");
    title.textContent = format(value);
    bar.append(title);
  });
  add("text", { x: 2, y: top + 10 }, format(max));
  add("text", { x: 2, y: height - bottom }, format(0));
  add("text", { x: left, y: height - 3 }, `${values.length} checkpoints, oldest first`);
}

async function renderJob(job) {
  const path = `/jobs/${encodeURIComponent(job)}/checkpoints`;
  const [{ body: stats, owner }, trend, latency] = await Promise.all([
    getJsonFrom(path),
    getJson(`${path}/trend`),
    getJson(`/jobs/${encodeURIComponent(job)}/latency`),
  ]);
  $("#job-id").textContent = job;
  $("#job-owner").textContent = owner ?? "-";
  const counts = stats.counts;
  $("#counts").replaceChildren(
    card("completed", counts.completed, "completed"),
    card("in progress", counts.in_progress, "in-progress"),
    card("failed", counts.failed, "failed"),
    card("restored", counts.restored, "restored"),
    card("triggered", counts.total, "total"),
  );
  const latest = stats.latest;
  $("#latest tbody").replaceChildren(
    latestRow("completed", latest.completed),
    latestRow("savepoint", latest.savepoint),
    latestRow("failed", latest.failed),
    latestRow("restored", latest.restored),
  );
  $("#history tbody").replaceChildren(
    ...stats.history.map((entry) =>
      el(
        "tr",
        { "data-checkpoint": entry.id },
        el("td", { class: "num" }, entry.id),
        el("td", {}, status(entry.status)),
        el("td", {}, entry.checkpoint_type),
        el("td", { class: "num acks" }, `${entry.num_acknowledged_subtasks}/${entry.num_subtasks}`),
        el("td", {}, formatTime(entry.trigger_timestamp)),
        el("td", { class: "num" }, formatMs(entry.end_to_end_duration)),
        el("td", { class: "num" }, formatBytes(entry.state_size)),
        el("td", { class: "wrap" }, entry.failure_message || ""),
      ),
    ),
  );
  renderLatency(latency);
  barChart($("#duration-chart"), trend.end_to_end_duration, formatMs);
  barChart($("#size-chart"), trend.state_size, formatBytes);
}

// Latency markers (Flink's latency metrics): one row per operator, source to sink.
function renderLatency(latency) {
  const figure = (value) => (value === null || value === undefined ? "-" : `${Math.round(value)} ms`);
  $("#latency-granularity").textContent = `granularity ${latency.granularity}`;
  $("#latency tbody").replaceChildren(
    ...latency.operators.map((row) =>
      el(
        "tr",
        { "data-operator": row.operator_id },
        el("td", {}, row.operator_id),
        el("td", { class: "num count" }, row.count),
        el("td", { class: "num p50" }, figure(row.p50)),
        el("td", { class: "num p99" }, figure(row.p99)),
        el("td", { class: "num max" }, figure(row.max)),
        el("td", { class: "num" }, figure(row.mean)),
      ),
    ),
  );
  $("#no-latency").hidden = latency.operators.length > 0;
}

async function refresh() {
  const where = route();
  $("#jobs-page").hidden = where.page !== "jobs";
  $("#job-page").hidden = where.page !== "job";
  try {
    if (where.page === "job") await renderJob(where.job);
    else await renderJobs();
    $("#error").hidden = true;
    $("#live").classList.remove("stale");
  } catch (error) {
    $("#error").textContent = `${error.message}; retrying every second`;
    $("#error").hidden = false;
    $("#live").classList.add("stale");
  }
}

window.addEventListener("hashchange", refresh);
refresh();
setInterval(refresh, POLL_MS);
