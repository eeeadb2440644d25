// Ember's live page: reads the driver's JSON view and follows /api/events. Read-only.
// Everything from the driver is put in the page as text (textContent), never as HTML.
"use strict";

const TASKS_PER_PAGE = 100;
const JOBS_PER_PAGE = 50;
const TIMELINE_MAX = 500;

const view = {
  leading: false,
  clockSkew: 0, // the driver's clock less this browser's, in ms
  jobs: [],
  jobsBefore: [0], // the `before` of each jobs page visited; the last is shown
  olderJobs: null,
  job: null, // the job whose tasks are shown
  taskOffset: 0,
  timeline: [],
};

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (key === "class") node.className = value;
    else if (key === "style") node.style.cssText = value;
    else if (key.startsWith("data-")) node.setAttribute(key, value);
    else node[key] = value;
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function driverNow() {
  return Date.now() + view.clockSkew;
}

function bytes(n) {
  if (n < 1024) return `${n} B`;
  const units = ["KiB", "MiB", "GiB", "TiB"];
  let value = n / 1024, unit = 0;
  while (value >= 1024 && unit < units.length - 1) { value /= 1024; unit += 1; }
  return `${value.toFixed(1)} ${units[unit]}`;
}

// What an executor (or all of them) did with the cluster's objects, as its heartbeats say.
function objectCounts(o) {
  if (!o) return "";
  return `fetched ${o.fetches || 0} (${bytes(o.fetched_bytes || 0)}), ` +
    `from the host ${o.host_takes || 0} (${bytes(o.host_taken_bytes || 0)}), ` +
    `cache ${o.cache_hits || 0} hits / ${o.cache_misses || 0} misses, put ${o.puts || 0}`;
}

function duration(ms) {
  if (ms === null || ms === undefined || ms < 0) return "";
  if (ms < 1000) return `${ms} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min ${Math.floor(s % 60)} s`;
  return `${Math.floor(m / 60)} h ${m % 60} min`;
}

function clock(ms) {
  return new Date(ms).toLocaleTimeString();
}

// Calls `fn` at most once every `ms`, the last call winning.
function throttle(fn, ms) {
  let timer = null;
  let again = false;
  return function run() {
    if (timer) { again = true; return; }
    fn();
    timer = setTimeout(() => { timer = null; if (again) { again = false; run(); } }, ms);
  };
}

async function getJSON(url) {
  let response;
  try {
    response = await fetch(url, { cache: "no-store" });
  } catch (e) {
    return { ok: false, error: "the driver cannot be reached" };
  }
  let body = null;
  try { body = await response.json(); } catch (e) { /* not JSON */ }
  if (!response.ok) return { ok: false, status: response.status, error: body && body.error };
  if (body && typeof body.now_ms === "number") view.clockSkew = body.now_ms - Date.now();
  return { ok: true, body };
}

function banner(text) {
  $("banner").hidden = !text;
  $("banner").textContent = text || "";
}

function showStatus(status) {
  view.leading = status.leading;
  view.epoch = status.epoch;
  $("cluster").textContent = `cluster ${status.cluster}`;
  const badge = $("leader");
  badge.className = "badge " + (status.leading ? "lead" : "standby");
  badge.textContent = status.leading
    ? `leading${status.epoch ? ", epoch " + status.epoch : ""}`
    : "standing by";
  const store = $("store");
  store.hidden = !status.store;
  store.textContent = status.store
    ? `store ${status.store.objects} objects, ${bytes(status.store.bytes)}`
    : "";
  store.title = status.store ? `as the sweep at ${clock(status.store.at_ms)} listed it` : "";
  banner(status.leading ? "" : "This driver stands by: the leading driver's page shows the cluster. This page fills in if this driver takes over.");
}

// ---- executors ----

async function loadExecutors() {
  const got = await getJSON("/api/executors?limit=500");
  if (!got.ok) return failed(got);
  renderExecutors(got.body);
}

function renderExecutors(snapshot) {
  const now = snapshot.now_ms;
  const rows = snapshot.executors.map((e) => {
    const attributes = Object.entries(e.attributes || {}).map(([k, v]) => el("span", { class: "attr" }, `${k}=${v}`));
    const exclusions = (e.exclusions || []).map((x) =>
      el("span", { class: "attr stale", title: `${x.reason}, until ${clock(x.until_ms)}` }, `excluded from ${exclusionTarget(x)}`));
    const logs = Object.entries(e.log_urls || {}).map(([name, url]) =>
      /^https?:\/\//i.test(url)
        ? el("a", { href: url, target: "_blank", rel: "noopener noreferrer" }, name, " ")
        : el("span", { title: url }, name, " "));
    const seen = typeof e.last_seen_ms === "number" ? now - e.last_seen_ms : null;
    return el("tr", { "data-executor": e.executor_id },
      el("td", { class: "mono" }, e.executor_id),
      el("td", {}, e.host),
      el("td", { class: "num" }, `${e.free_cores} / ${e.total_cores}`),
      el("td", {}, ...attributes, ...exclusions),
      el("td", {}, ...logs),
      el("td", {}, objectCounts(e.objects)),
      el("td", { class: "num" + (seen !== null && seen > 5000 ? " stale" : "") }, seen === null ? "" : `${duration(seen)} ago`));
  });
  $("executors").tBodies[0].replaceChildren(...bySite(snapshot.executors, rows));
  $("executor-totals").textContent =
    `${snapshot.registered_executors} registered, ${snapshot.total_cores} cores` +
    (snapshot.pending_executors ? `, ${snapshot.pending_executors} pending` : "") +
    (snapshot.objects ? `; objects ${objectCounts(snapshot.objects)}` : "");
  const more = $("executors-more");
  more.hidden = !snapshot.next_offset;
  more.textContent = snapshot.next_offset ? `showing the first ${snapshot.executors.length}` : "";
}

// The executors' rows grouped by site (their `site` attribute, `ember-executor --site`), each
// group under a row that counts it, sites by name and those without one last; as they came when
// no executor has a site.
function bySite(executors, rows) {
  const site = (e) => (e.attributes || {}).site;
  if (!executors.some(site)) return rows;
  const groups = new Map();
  executors.forEach((e, i) => {
    const key = site(e) ?? null;
    if (!groups.has(key)) groups.set(key, { executors: 0, total: 0, free: 0, rows: [] });
    const g = groups.get(key);
    g.executors += 1; g.total += e.total_cores; g.free += e.free_cores; g.rows.push(rows[i]);
  });
  const keys = [...groups.keys()].sort((a, b) => (a === null) - (b === null) || String(a).localeCompare(String(b)));
  return keys.flatMap((key) => {
    const g = groups.get(key);
    const name = key === null ? "no site" : `site ${key}`;
    const head = el("tr", { class: "site", "data-site": key ?? "" },
      el("th", { colSpan: 7 }, `${name}: ${g.executors} executor${g.executors === 1 ? "" : "s"}, ${g.free} of ${g.total} cores free`));
    return [head, ...g.rows];
  });
}

// What an exclusion covers, in words (as `ember executors` says it).
function exclusionTarget(x) {
  switch (x.scope) {
    case "task": return `task ${x.index} of job ${x.job_id}`;
    case "job": return `job ${x.job_id}`;
    default: return "every job";
  }
}

// ---- jobs ----

async function loadJobs() {
  const before = view.jobsBefore[view.jobsBefore.length - 1];
  const got = await getJSON(`/api/jobs?limit=${JOBS_PER_PAGE}&before=${before}`);
  if (!got.ok) return failed(got);
  view.jobs = got.body.jobs;
  view.olderJobs = got.body.next_job || null;
  renderJobs();
}

function progress(job) {
  const done = job.succeeded + job.failed + job.killed;
  const percent = job.tasks ? Math.floor((100 * done) / job.tasks) : 100;
  const running = job.tasks ? (100 * job.running) / job.tasks : 0;
  return el("div", { class: "bar", "data-percent": String(percent) },
    el("div", { class: "done", style: `width:${percent}%` }),
    el("div", { class: "running", style: `left:${percent}%;width:${running}%` }),
    el("span", { class: "label" }, `${percent}%`));
}

function jobDuration(job) {
  return duration((job.ended_at_ms || driverNow()) - job.submitted_at_ms);
}

function renderJobs() {
  const rows = view.jobs.map((job) => {
    const row = el("tr", { "data-job": String(job.job_id), "data-state": job.state,
        class: view.job === job.job_id ? "selected" : "", title: job.reason || "" },
      el("td", { class: "num" }, job.job_id),
      el("td", {}, job.name),
      el("td", { class: `state ${job.state}`, title: job.waiting || "" },
        job.state === "WAITING" && job.waits_for ? `WAITING for job ${job.waits_for.join(", ")}` : job.state),
      el("td", {}, progress(job)),
      el("td", { class: "num" }, `${job.succeeded} / ${job.failed} / ${job.killed} / ${job.running} / ${job.tasks}`),
      el("td", { class: "num duration" }, jobDuration(job)));
    row.addEventListener("click", () => selectJob(job.job_id));
    return row;
  });
  $("jobs").tBodies[0].replaceChildren(...rows);
  const running = view.jobs.filter((j) => j.state === "RUNNING").length;
  const waiting = view.jobs.filter((j) => j.state === "WAITING").length;
  $("job-totals").textContent = `${view.jobs.length} shown, ${running} running` +
    (waiting ? `, ${waiting} waiting` : "");
  $("jobs-older").hidden = !view.olderJobs;
  $("jobs-newer").hidden = view.jobsBefore.length < 2;
}

function tickDurations() {
  const rows = $("jobs").tBodies[0].rows;
  view.jobs.forEach((job, i) => {
    if (!job.ended_at_ms && rows[i]) rows[i].querySelector(".duration").textContent = jobDuration(job);
  });
}

// ---- one job's tasks ----

function selectJob(jobId) {
  view.job = jobId;
  view.taskOffset = 0;
  $("tasks-section").hidden = false;
  $("tasks-job").textContent = String(jobId);
  renderJobs();
  loadTasks();
}

function jobTasks() {
  const job = view.jobs.find((j) => j.job_id === view.job);
  return job ? job.tasks : null;
}

async function loadTasks() {
  if (view.job === null) return;
  const jobId = view.job;
  const got = await getJSON(`/api/jobs/${jobId}/tasks?offset=${view.taskOffset}&limit=${TASKS_PER_PAGE}`);
  if (jobId !== view.job) return;
  if (!got.ok) {
    $("tasks").tBodies[0].replaceChildren(el("tr", {}, el("td", { colSpan: 8 }, got.error || "not available")));
    return;
  }
  renderTasks(got.body);
}

function renderTasks(page) {
  const now = page.now_ms;
  const rows = page.results.map((t) => {
    let took = "";
    if (typeof t.duration_ms === "number") took = duration(t.duration_ms);
    else if (t.state === "RUNNING" && typeof t.started_ms === "number") took = duration(now - t.started_ms);
    const state = t.state === "LAUNCHING" && t.attempts === 0 ? "WAITING" : t.state;
    const result = t.result === undefined ? (t.result_object ? `(${t.result_object.bytes} bytes, object ${t.result_object.object.slice(0, 12)}…)` : "")
      : (typeof t.result === "string" ? t.result : JSON.stringify(t.result));
    return el("tr", { "data-task": String(t.index) },
      el("td", { class: "num" }, t.index),
      el("td", { class: "num" }, t.task_id),
      el("td", { class: `state ${t.state}` }, state),
      el("td", { class: "mono" }, t.executor_id || ""),
      el("td", { class: "num" }, t.attempts),
      el("td", { class: "num" }, took),
      el("td", { class: "err" }, t.error || ""),
      el("td", { class: "result mono" }, result));
  });
  $("tasks").tBodies[0].replaceChildren(...rows);
  const total = jobTasks();
  const first = page.results.length ? page.results[0].index : view.taskOffset;
  const last = first + page.results.length;
  $("tasks-range").textContent = `tasks ${first}–${Math.max(first, last - 1)}` + (total !== null ? ` of ${total}` : "");
}

function pageTasks(where) {
  const total = jobTasks() || 0;
  const lastPage = Math.max(0, Math.floor((total - 1) / TASKS_PER_PAGE) * TASKS_PER_PAGE);
  const offsets = {
    first: 0,
    prev: Math.max(0, view.taskOffset - TASKS_PER_PAGE),
    next: Math.min(lastPage, view.taskOffset + TASKS_PER_PAGE),
    last: lastPage,
  };
  view.taskOffset = offsets[where];
  loadTasks();
}

// ---- timeline ----

function describe(n) {
  switch (n.type) {
    case "ExecutorAdded":
      return ["added", "executor added", `${n.executor_id} on ${n.info.host}, ${n.info.total_cores} cores`];
    case "ExecutorRemoved":
      return ["removed", "executor removed", `${n.executor_id}: ${n.reason}`];
    case "ExecutorExcluded":
      return ["removed", "executor excluded", `${n.executor_id} from ${exclusionTarget(n)}: ${n.reason}`];
    case "ExecutorUnexcluded":
      return ["added", "executor back", `${n.executor_id} for ${exclusionTarget(n)}: ${n.reason}`];
    case "JobStart":
      return ["started", "job started", `job ${n.job_id}${n.name ? " (" + n.name + ")" : ""}, ${n.tasks} tasks`];
    case "JobEnd":
      return ["ended", `job ${n.state.toLowerCase()}`,
        `job ${n.job_id}: ${n.succeeded} succeeded, ${n.failed} failed, ${n.killed} killed` + (n.reason ? ` (${n.reason})` : "")];
    default:
      return null;
  }
}

function addToTimeline(notice) {
  if (!describe(notice)) return;
  view.timeline.push(notice);
  if (view.timeline.length > TIMELINE_MAX) view.timeline.shift();
}

function renderTimeline() {
  const items = view.timeline.slice().reverse().map((n) => {
    const [cls, kind, text] = describe(n);
    return el("li", { "data-kind": n.type },
      el("time", {}, clock(n.time_ms)), el("span", { class: `kind ${cls}` }, kind), text);
  });
  $("timeline").replaceChildren(...items);
}

async function loadTimeline() {
  const got = await getJSON("/api/timeline");
  if (!got.ok) return;
  view.timeline = [];
  got.body.forEach(addToTimeline);
  renderTimeline();
}

// ---- live ----

function failed(got) {
  if (got.status === 503 && !view.leading) return;
  banner(got.error ? `The driver did not answer: ${got.error}` : "The driver cannot be reached; retrying.");
}

const refreshExecutors = throttle(loadExecutors, 300);
const refreshJobs = throttle(loadJobs, 300);
const refreshTasks = throttle(loadTasks, 1000);

function refreshAll() {
  if (!view.leading) return;
  refreshExecutors();
  refreshJobs();
  refreshTasks();
  loadTimeline();
}

function onNotice(notice) {
  switch (notice.type) {
    case "ExecutorAdded":
    case "ExecutorRemoved":
    case "ExecutorExcluded":
    case "ExecutorUnexcluded":
      refreshExecutors();
      break;
    case "JobStart":
    case "JobEnd":
      refreshJobs();
      if (notice.job_id === view.job) refreshTasks();
      break;
    case "TaskProgress":
      refreshJobs();
      refreshExecutors();
      if (notice.job_id === view.job) refreshTasks();
      break;
  }
  if (describe(notice)) {
    addToTimeline(notice);
    renderTimeline();
  }
}

function connect() {
  const events = new EventSource("/api/events");
  events.addEventListener("open", () => {
    $("live").className = "badge on";
    $("live").textContent = "live";
  });
  events.addEventListener("error", () => {
    view.streaming = false;
    $("live").className = "badge off";
    $("live").textContent = "offline, reconnecting";
  });
  events.addEventListener("status", (e) => {
    const [wasLeading, wasEpoch, first] = [view.leading, view.epoch, !view.streaming];
    view.streaming = true;
    showStatus(JSON.parse(e.data));
    // A new stream or a new leadership: fetch everything; the store's figures alone: no.
    if (view.leading && (first || !wasLeading || view.epoch !== wasEpoch)) refreshAll();
    else if (wasLeading) banner("This driver no longer leads.");
  });
  events.addEventListener("notice", (e) => onNotice(JSON.parse(e.data)));
  // This stream fell behind and lost notices: fetch what is shown again.
  events.addEventListener("resync", refreshAll);
}

function start() {
  $("tasks-close").addEventListener("click", () => {
    view.job = null;
    $("tasks-section").hidden = true;
    renderJobs();
  });
  for (const where of ["first", "prev", "next", "last"]) {
    $(`tasks-${where}`).addEventListener("click", () => pageTasks(where));
  }
  $("jobs-older").addEventListener("click", () => {
    if (view.olderJobs) { view.jobsBefore.push(view.olderJobs); loadJobs(); }
  });
  $("jobs-newer").addEventListener("click", () => {
    if (view.jobsBefore.length > 1) { view.jobsBefore.pop(); loadJobs(); }
  });
  connect();
  // Heartbeats publish no event: the executors' ages are fetched again every 2 s.
  setInterval(() => { if (view.leading) refreshExecutors(); }, 2000);
  setInterval(tickDurations, 1000);
}

start();
