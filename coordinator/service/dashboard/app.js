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

// #/ (the jobs), #/jobs/<job> (its Overview tab), #/jobs/<job>/summary, #/jobs/<job>/config, and
// #/jobs/<job>/checkpoints/<id> (one checkpoint with its tasks). A job id is URI-encoded: no "/".
function route() {
  const match = location.hash.match(/^#\/jobs\/([^/]+)(?:\/(summary|config|checkpoints\/([0-9]+)))?$/);
  if (!match) return { page: "jobs" };
  const job = decodeURIComponent(match[1]);
  if (match[3] !== undefined) return { page: "job", job, tab: "checkpoint", checkpoint: Number(match[3]) };
  return { page: "job", job, tab: match[2] ?? "overview" };
}

const jobLink = (job, rest = "") => `#/jobs/${encodeURIComponent(job)}${rest}`;

// The worker's own state, for the header on every page: the live dot and the banner. A dead broker
// must not look healthy: the views answer from memory, so only the worker's probe of its broker
// (/overview, as /ready) tells.
let overview = null;

async function renderHealth() {
  try {
    overview = await getJson("/overview");
  } catch (error) {
    overview = null;
    throw error;
  }
  const broker = overview.broker;
  const down = broker.reachable === false;
  $("#worker").textContent = `worker ${overview.self}`;
  $("#live").classList.toggle("down", down);
  $("#live").title = down ? `the broker at ${broker.bootstrap} is unreachable` : "updates every second";
  document.body.classList.toggle("broker-down", down);
  const banner = $("#banner");
  banner.hidden = overview.ready;
  banner.className = `banner ${down ? "down" : "warn"}`;
  if (down) {
    banner.replaceChildren(
      el("b", {}, "Broker unreachable. "),
      `This worker cannot reach the broker at ${broker.bootstrap} since ${formatTime(broker.since)} UTC ` +
        `(${broker.error ?? "no answer"}). No checkpoint is triggered, acknowledged or completed until it ` +
        "answers; the jobs below are shown as they were then.",
    );
  } else if (!overview.ready) {
    banner.replaceChildren(el("b", {}, "Not ready. "), overview.problems.join("; "));
  }
}

function ago(ms) {
  if (ms === null || ms === undefined || !overview) return "";
  const seconds = Math.max(0, Math.round((overview.now - ms) / 1000));
  return seconds < 120 ? ` (${seconds} s ago)` : ` (${Math.round(seconds / 60)} min ago)`;
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
        { "data-job": job.id, class: job.undecided ? "undecided" : "" },
        el("td", {}, el("a", { href: `#/jobs/${encodeURIComponent(job.id)}` }, job.id)),
        // A job of a partition its worker recovers again after a failed journal write: as it stood.
        el("td", {}, status(job.status),
          job.undecided ? el("span", { class: "undecided-note", title: job.undecided }, " not decided now") : ""),
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

function latestRow(job, label, entry) {
  if (!entry) return el("tr", {}, el("th", {}, label), el("td", { colspan: 3 }, "none"));
  const detail = entry.failure_message || entry.external_path || "";
  // a restore names a checkpoint that may be long gone from the history: no details to open
  const id = entry.restore_timestamp === undefined
    ? el("a", { href: jobLink(job, `/checkpoints/${entry.id}`) }, `#${entry.id}`)
    : `#${entry.id}`;
  return el(
    "tr",
    { "data-latest": label },
    el("th", {}, label),
    el("td", {}, id),
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

// The job's status line: status, attempt, restarts, its tasks, the latest acknowledgement.
function renderJobLine(info, owner) {
  $("#job-id").textContent = info.id;
  $("#job-owner").textContent = owner ?? "-";
  const badge = $("#job-status");
  badge.textContent = info.status ?? "-";
  badge.className = `badge status-${info.status}`;
  const notRunning = Object.keys(info.tasks_not_running);
  const tasks = notRunning.length
    ? `${info.tasks} tasks, ${notRunning.length} not running (${notRunning.map((t) => `${t} ${info.tasks_not_running[t]}`).join(", ")})`
    : `${info.tasks} tasks, all running`;
  const facts = [`attempt ${info.attempt}`, `restarts ${info.restarts}`, tasks];
  facts.push(
    info.latest_ack_timestamp === null
      ? "no acknowledgement yet"
      : `latest acknowledgement ${formatTime(info.latest_ack_timestamp)} UTC${ago(info.latest_ack_timestamp)}`,
  );
  if (info.restart) facts.push(`restart: attempt ${info.restart.attempt} at ${formatTime(info.restart.at)} UTC`);
  if (info.restart && info.restart.overdue) facts.push(`⚠ ${info.restart.overdue}`);
  if (info.stopping) facts.push("stopping with a savepoint");
  $("#job-facts").textContent = facts.join(" · ");
}

function showTab(job, where) {
  for (const link of document.querySelectorAll("#tabs a")) {
    const tab = link.dataset.tab;
    if (tab === "checkpoint") {
      link.hidden = where.tab !== "checkpoint";
      link.href = where.tab === "checkpoint" ? jobLink(job, `/checkpoints/${where.checkpoint}`) : "#";
      $("#tab-checkpoint-id").textContent = where.checkpoint ?? "";
    } else {
      link.href = jobLink(job, tab === "overview" ? "" : `/${tab}`);
    }
    link.classList.toggle("active", tab === where.tab);
    $(`#tab-${tab}`).hidden = tab !== where.tab;
  }
}

const TABS = { overview: renderOverview, summary: renderSummary, config: renderConfig, checkpoint: renderCheckpoint };

async function renderJob(where) {
  const job = where.job;
  const [{ body: info, owner }] = await Promise.all([
    getJsonFrom(`/jobs/${encodeURIComponent(job)}`),
    TABS[where.tab](job, where),
  ]);
  renderJobLine(info, owner);
  showTab(job, where);
}

async function renderOverview(job) {
  const path = `/jobs/${encodeURIComponent(job)}/checkpoints`;
  const [stats, trend, latency] = await Promise.all([
    getJson(path),
    getJson(`${path}/trend`),
    getJson(`/jobs/${encodeURIComponent(job)}/latency`),
  ]);
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
    latestRow(job, "completed", latest.completed),
    latestRow(job, "savepoint", latest.savepoint),
    latestRow(job, "failed", latest.failed),
    latestRow(job, "restored", latest.restored),
  );
  $("#history tbody").replaceChildren(
    ...stats.history.map((entry) =>
      el(
        "tr",
        { "data-checkpoint": entry.id },
        el("td", { class: "num" }, el("a", { href: jobLink(job, `/checkpoints/${entry.id}`) }, entry.id)),
        el("td", {}, status(entry.status)),
        el("td", {}, entry.checkpoint_type),
        el("td", { class: "num acks" }, `${entry.num_acknowledged_subtasks}/${entry.num_subtasks}`),
        el("td", {}, formatTime(entry.trigger_timestamp)),
        el("td", { class: "latest-ack" }, formatTime(entry.latest_ack_timestamp)),
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

// The Summary tab: Flink's checkpoint summary, its rows and units as the coordinator shows them.
async function renderSummary(job) {
  const summary = await getJson(`/jobs/${encodeURIComponent(job)}/checkpoints/summary`);
  $("#summary-scope").textContent =
    `Over the last ${summary.count} completed checkpoints (at most ${summary.window}), savepoints included.`;
  $("#summary").hidden = summary.rows.length === 0;
  $("#no-summary").hidden = summary.rows.length > 0;
  $("#summary tbody").replaceChildren(
    ...summary.rows.map((row) =>
      el(
        "tr",
        { "data-statistic": row.statistic },
        el("th", {}, row.label),
        el("td", { class: "num duration" }, row.shown.end_to_end_duration),
        el("td", { class: "num size" }, row.shown.checkpointed_size),
      ),
    ),
  );
}

// The Configuration tab: each setting with its unit, as the coordinator shows it.
async function renderConfig(job) {
  const config = await getJson(`/jobs/${encodeURIComponent(job)}/checkpoints/config`);
  const rows = config.shown ?? [];
  $("#no-config").hidden = rows.length > 0;
  $("#config tbody").replaceChildren(
    ...rows.map((row) => el("tr", { "data-setting": row.key }, el("th", {}, row.label), el("td", { class: "wrap" }, row.shown))),
  );
}

// One checkpoint, and each of its tasks: acknowledged or not, when, how long after the trigger,
// its state's size, inline in the ack or in a file.
async function renderCheckpoint(job, where) {
  const details = await getJson(`/jobs/${encodeURIComponent(job)}/checkpoints/details/${where.checkpoint}`);
  $("#checkpoint-id").textContent = details.id;
  const badge = $("#checkpoint-status");
  badge.textContent = details.status;
  badge.className = `badge status-${details.status}`;
  const facts = [
    ["type", details.checkpoint_type],
    ["acknowledged", `${details.num_acknowledged_subtasks}/${details.num_subtasks} tasks`],
    ["triggered (UTC)", formatTime(details.trigger_timestamp)],
    ["latest acknowledgement (UTC)", formatTime(details.latest_ack_timestamp)],
    ["end-to-end duration", formatMs(details.end_to_end_duration)],
    ["checkpointed data size", formatBytes(details.state_size)],
  ];
  if (details.external_path) facts.push(["path", details.external_path]);
  if (details.failure_message) facts.push(["failure", details.failure_message]);
  $("#checkpoint-facts tbody").replaceChildren(
    ...facts.map(([label, value]) => el("tr", {}, el("th", {}, label), el("td", { class: "wrap" }, value))),
  );
  const tasks = details.tasks ?? [];
  $("#tasks").hidden = details.tasks === null;
  $("#no-tasks").hidden = details.tasks !== null;
  $("#no-tasks").textContent = details.tasks_missing ?? "";
  $("#tasks tbody").replaceChildren(
    ...tasks.map((task) =>
      el(
        "tr",
        { "data-task": task.task_id },
        el("td", {}, task.task_id),
        el("td", { class: "status" }, status(task.status)),
        el("td", {}, formatTime(task.ack_timestamp)),
        el("td", { class: "num duration" }, formatMs(task.end_to_end_duration)),
        el("td", { class: "num size" }, task.storage === null ? "no state" : formatBytes(task.state_size)),
        el("td", { class: "storage" }, task.storage ?? "-"),
      ),
    ),
  );
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
    await renderHealth();
    if (where.page === "job") await renderJob(where);
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
