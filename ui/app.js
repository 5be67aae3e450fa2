// The supervisor's operator page: plain JS, no build step.
// Talks to the management API (same origin) and to the gateway's data plane
// (its port, CORS) with the management token kept in localStorage.
"use strict";

const TOKEN_KEY = "inference-service.token";
const PLACEHOLDER_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
const TERMINAL = ["done", "failed", "timeout"];
const $ = (sel) => document.querySelector(sel);

const DETECTION_MAX_RESULTS = 20; // options.max_results the page sends to detection and segmentation models
const LEVELS = ["debug", "info", "warn", "error", "critical"];

const state = { token: localStorage.getItem(TOKEN_KEY) || "", status: null, catalog: [], busy: new Set(),
                logServer: null, logOffset: null, logLines: [], image: null, imageB64: null,
                refreshTimer: null, logTimer: null, seriesTimer: null, series: null, defaults: {}, versions: {} };

// -- API ---------------------------------------------------------------------------------

class HttpError extends Error {
  constructor(status, body) { super(body && (body.error || body.status_str) || `HTTP ${status}`); this.status = status; this.body = body; }
}

async function api(path, options = {}) {
  const response = await fetch(path, { ...options, headers: { Authorization: `Bearer ${state.token}`, ...(options.headers || {}) } });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  if (response.status === 401) { showLogin("The token was refused."); throw new HttpError(401, body); }
  if (!response.ok) throw new HttpError(response.status, body);
  return body;
}

function gatewayBase() {
  const port = state.status ? state.status.gateway.port : 8080;
  return `${location.protocol}//${location.hostname}:${port}`;
}

async function gateway(path, options = {}) {
  const response = await fetch(gatewayBase() + path, {
    ...options,
    headers: { Authorization: `Bearer ${state.token}`, "Content-Type": "application/json", ...(options.headers || {}) },
  });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  return { status: response.status, body };
}

// -- login ---------------------------------------------------------------------------------

function showLogin(message) {
  clearInterval(state.refreshTimer);
  clearInterval(state.logTimer);
  clearInterval(state.seriesTimer);
  $("#console").hidden = true;
  $("#login").hidden = false;
  $("#forget").hidden = true;
  $("#login-error").textContent = message || "";
  $("#token-input").focus();
}

async function connect() {
  try {
    await refresh();
  } catch (e) {
    if (!(e instanceof HttpError && e.status === 401)) showLogin(`Cannot reach the supervisor: ${e.message}`);
    return;
  }
  $("#login").hidden = true;
  $("#console").hidden = false;
  $("#forget").hidden = false;
  state.catalog = (await api("/api/v1/catalog")).models;
  fillSelects();
  state.refreshTimer = setInterval(() => refresh().catch(() => {}), 2000);
  state.logTimer = setInterval(() => followLogs().catch(() => {}), 1500);
  refreshSeries().catch(() => {});
  state.seriesTimer = setInterval(() => refreshSeries().catch(() => {}), 5000);
}

// -- status ----------------------------------------------------------------------------------

function badge(el, text) {
  // The colour comes from data-tone, so the element keeps its own classes (".state" in the table).
  el.textContent = text;
  el.dataset.tone = text.split(" ")[0];
}

async function refresh() {
  const status = await api("/api/v1/status");
  state.status = status;
  $("#summary").textContent = `version ${status.version} · profile ${status.profile} · device ${status.device}`;
  const gw = status.gateway;
  badge($("#gateway-state"), gw.state + (gw.state === "running" ? (gw.ready ? " · ready" : " · not ready") : ""));
  $("#gateway-state").dataset.state = gw.state;
  $("#gateway-url").textContent = gatewayBase();
  $("#gateway-error").textContent = gw.last_error || "";
  renderServers(status.servers);
  updateDemoBanner();
  return status;
}

function renderServers(servers) {
  const tbody = $("#catalog tbody");
  for (const s of servers) {
    const replicas = s.replicas || [];
    const several = replicas.length > 1;
    let row = tbody.querySelector(`tr.model[data-id="${s.id}"]`);
    if (!row) {
      row = serverRow(s.id, null);
      tbody.appendChild(row);
      // Charts are per process: the model's own when it runs one, each replica's otherwise.
      if (!several) tbody.appendChild(figuresRow(s.id));
      for (const r of several ? replicas : []) {
        tbody.appendChild(serverRow(s.id, r.index));
        tbody.appendChild(figuresRow(r.name));
      }
    }
    const idCell = row.querySelector(".id");
    idCell.textContent = s.id + (s.in_profile ? "" : " (not in profile)");
    const weights = weightsLabel(s.id);
    if (weights) {
      const tag = document.createElement("span");
      tag.className = `weights badge${weights.demo ? " demo" : ""}`;
      tag.textContent = weights.text;
      tag.title = weights.demo ? "random-init weights: the outputs mean nothing" : "";
      idCell.appendChild(tag);
    }
    if (several) {
      const count = document.createElement("span");
      count.className = "replica-count muted small";
      const ready = replicas.filter((r) => r.ready).length;
      count.textContent = ` ${replicas.length} replicas, ${ready} ready`;
      idCell.appendChild(count);
    }
    row.querySelector(".task").textContent = `${s.task || ""}${s.async ? " · async" : ""}`;
    fillRow(row, s, several ? replicas.map((r) => r.port).join(", ") : s.port, several ? replicas : [s]);
    for (const r of several ? replicas : []) {
      const sub = tbody.querySelector(`tr.replica[data-id="${s.id}"][data-replica="${r.index}"]`);
      if (!sub) continue;
      const pinned = [r.gpu !== null && r.gpu !== undefined ? `GPU ${r.gpu}` : "", r.cpus ? `CPUs ${r.cpus.join(",")}` : ""];
      sub.querySelector(".task").textContent = pinned.filter(Boolean).join(" · ");
      fillRow(sub, r, r.port, [r]);
    }
  }
}

// A row of the table: a model (replica null) or one replica of a model, with its buttons.
function serverRow(id, replica) {
  const row = document.createElement("tr");
  row.className = replica === null ? "model" : "replica";
  row.dataset.id = id;
  if (replica !== null) row.dataset.replica = String(replica);
  row.innerHTML = `<td class="id"></td><td class="task"></td><td><span class="state badge"></span></td>
    <td class="ready"></td><td class="restarts"></td><td class="port"></td><td class="last-error"></td>
    <td class="actions"><button data-action="start">Start</button> <button data-action="stop">Stop</button>
    <button data-action="restart">Restart</button></td>`;
  if (replica !== null) row.querySelector(".id").textContent = `replica ${replica}`;
  for (const button of row.querySelectorAll("button")) {
    button.dataset.target = id;
    if (replica !== null) button.dataset.replica = String(replica);
  }
  return row;
}

function figuresRow(name) {
  const figures = document.createElement("tr");
  figures.className = "figures";
  figures.dataset.for = name;
  figures.innerHTML = `<td colspan="8"><div class="charts"></div></td>`;
  return figures;
}

// State, readiness, restarts, port, last error and which buttons apply; `members` are the processes the
// row's actions act on (the replicas of a model, or the row's own process).
function fillRow(row, s, port, members) {
  badge(row.querySelector(".state"), s.state);
  row.dataset.state = s.state;
  row.dataset.ready = String(s.ready);
  row.querySelector(".ready").textContent = s.ready ? "yes" : "no";
  row.querySelector(".restarts").textContent = s.restarts;
  row.querySelector(".port").textContent = port;
  const err = row.querySelector(".last-error");
  err.textContent = s.last_error || "";
  err.title = s.last_error || "";
  const replica = row.dataset.replica;
  const busy = state.busy.has(row.dataset.id) || (replica !== undefined && state.busy.has(`${row.dataset.id}/${replica}`));
  const active = (m) => ["starting", "running", "stopping"].includes(m.state);
  row.querySelector('[data-action="start"]').disabled = busy || members.every(active);
  row.querySelector('[data-action="stop"]').disabled = busy || !members.some((m) => ["starting", "running", "backoff"].includes(m.state));
  row.querySelector('[data-action="restart"]').disabled = busy || members.some((m) => m.state === "stopping");
}

// -- weights ---------------------------------------------------------------------------------

function serverStatus(id) {
  return state.status ? state.status.servers.find((s) => s.id === id) : null;
}

// The model a process belongs to: the series name a process by its supervisor name (the model's id, or
// "<ID>.<n>" for replica n of a model that runs several).
function modelOf(name) {
  const s = state.status && state.status.servers.find((x) => (x.replicas || []).some((r) => r.name === name));
  return s ? s.id : name;
}

// What the page knows about a model's weights: the status's `weights` field when the supervisor
// reports it, else the version the model server reports (random-init-seed<N> for demo weights).
function weightsLabel(id) {
  const s = serverStatus(id);
  if (s && s.weights && s.weights.kind) {
    const w = s.weights;
    if (w.kind === "demo") return { demo: true, text: "demo weights" };
    return { demo: false, text: w.variant ? `${w.kind}: ${w.variant}` : w.kind };
  }
  const version = state.versions[id] || "";
  if (version.startsWith("random-init")) return { demo: true, text: "demo weights" };
  return null;
}

// -- charts ------------------------------------------------------------------------------------

const COLOURS = ["#2f7ed8", "#e4572e", "#17a398", "#9c59d1", "#f0a202", "#6c757d"];

async function refreshSeries() {
  const series = await api("/api/v1/series");
  state.series = series;
  for (const [id, s] of Object.entries(series.servers)) if (s.version) state.versions[modelOf(id)] = s.version;
  drawGatewayCharts(series);
  for (const [id, s] of Object.entries(series.servers)) drawModelCharts(id, s, series);
  if (state.status) renderServers(state.status.servers);
  updateDemoBanner();
}

function drawModelCharts(id, s, all) {
  const holder = document.querySelector(`tr.figures[data-for="${id}"] .charts`);
  if (!holder) return;
  const m = state.catalog.find((c) => c.id === modelOf(id));
  const span = { t: s.t, now: all.now, window: all.window_s };
  chart(holder, "rps", "requests/s", span, [{ name: "req/s", values: s.rps }], (v) => v.toFixed(2));
  chart(holder, "latency", "latency", span, [{ name: "p50", values: s.p50_ms }, { name: "p99", values: s.p99_ms }], ms);
  chart(holder, "batch", "batch size (mean)", span, [{ name: "items", values: s.batch_mean }], (v) => v.toFixed(1));
  chart(holder, "queue", "queue depth", span, [{ name: "items", values: s.queue_depth }], (v) => v.toFixed(0));
  if (m && m.async) {
    chart(holder, "jobs", "jobs", span,
          [{ name: "pending", values: s.jobs_pending }, { name: "running", values: s.jobs_running }], (v) => v.toFixed(0));
  }
}

function drawGatewayCharts(all) {
  const g = all.gateway;
  const holder = $("#gateway-charts");
  const span = { t: g.t, now: all.now, window: all.window_s };
  const labelled = (map) => Object.entries(map).map(([name, values]) => ({ name, values }));
  chart(holder, "rps_by_key", "requests/s by key", span, labelled(g.rps_by_key), (v) => v.toFixed(2));
  chart(holder, "rejections", "rejections/s by reason", span, labelled(g.rejections_by_reason), (v) => v.toFixed(2));
  chart(holder, "upstream_errors", "upstream errors/s", span, [{ name: "errors", values: g.upstream_errors }], (v) => v.toFixed(2));
}

function ms(v) {
  return v >= 1000 ? `${(v / 1000).toFixed(2)} s` : `${v.toFixed(v < 10 ? 1 : 0)} ms`;
}

// One small chart: an inline SVG with a line per series over the window, breaks where a sample is null
// (a failed scrape), and the newest value of each line in the title.
function chart(holder, key, title, span, lines, format) {
  const W = 190, H = 46, PAD = 3;
  let box = holder.querySelector(`.chart[data-figure="${key}"]`);
  if (!box) {
    box = document.createElement("div");
    box.className = "chart";
    box.dataset.figure = key;
    box.innerHTML = `<div class="title"><span class="name"></span><span class="value"></span></div>
      <svg viewBox="0 0 ${W} ${H}" preserveAspectRatio="none" role="img"></svg><div class="legend"></div>`;
    holder.appendChild(box);
  }
  box.querySelector(".name").textContent = title;
  let max = 0;
  for (const line of lines) for (const v of line.values) if (v !== null && v > max) max = v;
  const top = max > 0 ? max * 1.1 : 1;
  const x = (t) => PAD + (W - 2 * PAD) * (1 - (span.now - t) / span.window);
  const y = (v) => H - PAD - (H - 2 * PAD) * (v / top);
  const svg = box.querySelector("svg");
  svg.replaceChildren();
  const NS = "http://www.w3.org/2000/svg";
  const latest = [];
  lines.forEach((line, i) => {
    const colour = COLOURS[i % COLOURS.length];
    let d = "";
    let pen = false;
    let last = null;
    line.values.forEach((v, j) => {
      if (v === null || v === undefined) { pen = false; return; }
      d += `${pen ? "L" : "M"}${x(span.t[j]).toFixed(1)},${y(v).toFixed(1)}`;
      pen = true;
      last = v;
    });
    line.values.forEach((v, j) => { // a point between two gaps is a dot (a line needs two)
      const gap = (k) => k < 0 || k >= line.values.length || line.values[k] === null || line.values[k] === undefined;
      if (gap(j) || !gap(j - 1) || !gap(j + 1)) return;
      const dot = document.createElementNS(NS, "circle");
      dot.setAttribute("cx", x(span.t[j]).toFixed(1));
      dot.setAttribute("cy", y(v).toFixed(1));
      dot.setAttribute("r", "1.8");
      dot.setAttribute("fill", colour);
      svg.appendChild(dot);
    });
    if (d) {
      const path = document.createElementNS(NS, "path");
      path.setAttribute("d", d);
      path.setAttribute("fill", "none");
      path.setAttribute("stroke", colour);
      path.setAttribute("stroke-width", "1.5");
      path.setAttribute("vector-effect", "non-scaling-stroke");
      svg.appendChild(path);
    }
    latest.push({ name: line.name, colour, last });
  });
  const now = latest.map((l) => (l.last === null ? "–" : format(l.last))).join(" / ");
  box.querySelector(".value").textContent = lines.length ? now : "–";
  box.querySelector(".legend").innerHTML = "";
  for (const l of latest) {
    const item = document.createElement("span");
    const swatch = document.createElement("i");
    swatch.style.background = l.colour;
    item.append(swatch, l.name);
    box.querySelector(".legend").appendChild(item);
  }
  box.dataset.max = String(max);
  box.dataset.points = String(lines.reduce((n, l) => n + l.values.filter((v) => v !== null && v !== undefined).length, 0));
}

// A model's restart is rolling (one replica at a time); a replica's acts on that process alone.
async function act(target, action, button, replica) {
  const one = replica !== undefined;
  const label = (target === "__gateway" ? "gateway" : target) + (one ? ` replica ${replica}` : "");
  const key = one ? `${target}/${replica}` : target;
  state.busy.add(key);
  button.disabled = true;
  const message = $("#action-message");
  message.className = "muted";
  message.textContent = `${label}: ${action} requested…`;
  const path = `/api/v1/servers/${encodeURIComponent(target)}${one ? `/replicas/${replica}` : ""}/${action}`;
  try {
    await api(path, { method: "POST" });
    message.textContent = `${label}: ${action} done`;
  } catch (e) {
    message.className = "error";
    message.textContent = `${label}: ${action} failed: ${e.message}`;
  } finally {
    state.busy.delete(key);
    button.disabled = false;
    refresh().catch(() => {});
  }
}

// -- logs ----------------------------------------------------------------------------------------

function fillSelects() {
  const logSelect = $("#log-server");
  logSelect.innerHTML = "";
  logSelect.add(new Option("gateway", "__gateway"));
  for (const m of state.catalog) {
    const s = serverStatus(m.id);
    const replicas = s && s.replicas && s.replicas.length > 1 ? s.replicas : [];
    if (!replicas.length) logSelect.add(new Option(m.id, m.id));
    for (const r of replicas) logSelect.add(new Option(`${m.id} replica ${r.index}`, `${m.id}/${r.index}`));
  }
  state.logServer = logSelect.value;
  const trySelect = $("#try-model");
  trySelect.innerHTML = "";
  for (const m of state.catalog) trySelect.add(new Option(`${m.id} (${m.task || m.category || "?"}${m.async ? ", async" : ""})`, m.id));
  const classifier = state.catalog.find((m) => m.category === "classification");
  if (classifier) trySelect.value = classifier.id;
  $("#try-run").disabled = false;
  modelChosen();
}

// The level of a line as `twist --log-format text` writes it ("... [namespace#warn] ..."); a line
// without one (a traceback, a print) takes the level of the line before it on the same stream.
function lineLevel(line, previous) {
  const match = /\[[^\]\s]*#(debug|info|warn|error|critical)\]/.exec(line.line);
  if (match) return match[1];
  if (line.stream === "supervisor") return "info";
  return previous[line.stream] || (line.stream === "stderr" ? "error" : "info");
}

function logVisible(entry) {
  const floor = LEVELS.indexOf($("#log-level").value);
  const text = $("#log-filter").value.trim().toLowerCase();
  return LEVELS.indexOf(entry.level) >= floor && (!text || entry.line.toLowerCase().includes(text));
}

function applyLogFilters() {
  const pre = $("#log-lines");
  let shown = 0;
  for (const span of pre.children) {
    const visible = logVisible(span.entry);
    span.classList.toggle("hidden", !visible);
    if (visible) shown += 1;
  }
  $("#log-count").textContent = `${shown} of ${pre.children.length} lines`;
  pre.scrollTop = pre.scrollHeight;
}

async function followLogs() {
  if (!$("#log-follow").checked || !state.logServer) return;
  const query = state.logOffset === null ? "limit=500" : `offset=${state.logOffset}&limit=500`;
  // A model's replica is "ID/n" in the select: its own log (replicas/n/logs).
  const [id, replica] = state.logServer.split("/");
  const where = `/api/v1/servers/${encodeURIComponent(id)}${replica === undefined ? "" : `/replicas/${replica}`}`;
  const page = await api(`${where}/logs?${query}`);
  const pre = $("#log-lines");
  const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  state.logLevels = state.logLevels || {};
  for (const line of page.lines) {
    const level = lineLevel(line, state.logLevels);
    state.logLevels[line.stream] = level;
    const span = document.createElement("span");
    span.className = `${line.stream} level-${level}`;
    span.textContent = line.line + "\n";
    span.entry = { level, line: line.line };
    span.classList.toggle("hidden", !logVisible(span.entry));
    pre.appendChild(span);
  }
  while (pre.childNodes.length > 2000) pre.removeChild(pre.firstChild);
  state.logOffset = page.next_offset;
  if (page.lines.length) {
    const shown = [...pre.children].filter((c) => !c.classList.contains("hidden")).length;
    $("#log-count").textContent = `${shown} of ${pre.children.length} lines`;
  }
  if (atBottom) pre.scrollTop = pre.scrollHeight;
}

// -- try it ----------------------------------------------------------------------------------------

function selectedModel() {
  return state.catalog.find((m) => m.id === $("#try-model").value);
}

function clearResult() {
  $("#try-error").textContent = "";
  $("#try-result").innerHTML = "";
  $("#try-raw").hidden = true;
  $("#job").hidden = true;
  $("#job-progress").hidden = true;
}

function clearImage() {
  state.image = null;
  state.imageB64 = null;
  $("#try-file").value = "";
  const preview = $("#try-preview");
  preview.removeAttribute("src");
  preview.hidden = true;
}

// A new model starts from a clean form: its own defaults, no result; a generation model needs no photo.
function modelChosen() {
  const m = selectedModel();
  clearResult();
  $("#try-params").value = "";
  const note = $("#try-note");
  if (m && m.category === "generation") {
    clearImage();
    note.textContent = `${m.id} generates an image from noise: the pixels of a photo are ignored, so none is needed.`;
    note.hidden = false;
    $("#drop").hidden = true;
  } else {
    note.hidden = true;
    $("#drop").hidden = false;
  }
  updateDemoBanner();
  if (m) loadDefaults(m).catch(() => {});
}

function updateDemoBanner() {
  const m = selectedModel();
  const weights = m ? weightsLabel(m.id) : null;
  $("#try-demo").hidden = !(weights && weights.demo);
}

// The params' defaults as the running model server states them in its OpenAPI document.
async function loadDefaults(m) {
  const input = $("#try-params");
  if (!state.defaults[m.id]) {
    input.placeholder = "loading the defaults…";
    const reply = await api(`/api/v1/servers/${encodeURIComponent(m.id)}/openapi`).catch(() => null);
    const schema = reply && reply.openapi.components && reply.openapi.components.schemas[`${m.id}_Params`];
    if (!schema) {
      if (selectedModel() === m) input.placeholder = "{} (the model's defaults: it is not running)";
      return;
    }
    const defaults = {};
    for (const [name, prop] of Object.entries(schema.properties || {})) {
      if (prop.default !== undefined && prop.default !== null) defaults[name] = prop.default;
    }
    state.defaults[m.id] = defaults;
  }
  if (selectedModel() === m) input.placeholder = JSON.stringify(state.defaults[m.id]);
}

function takeFile(file) {
  if (!file) return;
  const reader = new FileReader();
  reader.onload = () => {
    state.image = reader.result;
    state.imageB64 = String(reader.result).split(",", 2)[1];
    const preview = $("#try-preview");
    preview.src = reader.result;
    preview.hidden = false;
  };
  reader.readAsDataURL(file);
}

function requestBody() {
  const m = selectedModel();
  const body = { images: [state.imageB64 || PLACEHOLDER_PNG] };
  const text = $("#try-params").value.trim();
  if (text) {
    try { body.params = JSON.parse(text); } catch (e) { throw new Error(`params are not JSON: ${e.message}`); }
  }
  if (m && (m.category === "detection" || m.category === "segmentation")) body.options = { max_results: DETECTION_MAX_RESULTS };
  if (!state.imageB64 && m && m.category !== "generation") throw new Error("choose or drop an image first");
  return body;
}

// The params in force: the box's, else the defaults the placeholder shows.
function effectiveParams(m, body) {
  return { ...(state.defaults[m.id] || {}), ...(body.params || {}) };
}

async function run() {
  const m = selectedModel();
  clearResult();
  let body;
  try { body = requestBody(); } catch (e) { $("#try-error").textContent = e.message; return; }
  $("#try-run").disabled = true;
  try {
    const params = effectiveParams(m, body);
    if (m.async) await runJob(m, body, params);
    else show(m, await gateway(`/v1/models/${m.id}/infer`, { method: "POST", body: JSON.stringify(body) }), params);
  } catch (e) {
    $("#try-error").textContent = `Request failed: ${e.message} (is the gateway running, and does it allow this page's origin?)`;
  } finally {
    $("#try-run").disabled = false;
  }
}

function showProgress(current) {
  const p = current.progress;
  if (!p || !p.steps) return;
  const done = Math.min(p.step, p.steps);
  $("#job-progress").hidden = false;
  const bar = $("#job-progress progress");
  bar.max = p.steps;
  bar.value = done;
  let eta = "";
  if (TERMINAL.includes(current.state)) eta = "";
  else if (done > 0 && current.elapsed_ms) {
    const left = (current.elapsed_ms / done) * (p.steps - done) / 1000;
    eta = ` · about ${left < 10 ? left.toFixed(1) : Math.round(left)} s left`;
  }
  $("#job-eta").textContent = `step ${done} of ${p.steps}${eta}`;
}

async function runJob(m, body, params) {
  const submitted = await gateway(`/v1/models/${m.id}/jobs`, { method: "POST", body: JSON.stringify(body) });
  if (submitted.status !== 202) { show(m, submitted, params); return; }
  const job = submitted.body;
  $("#job").hidden = false;
  $("#job-id").textContent = job.job_id;
  $("#job-elapsed").textContent = "";
  badge($("#job-state"), job.state);
  let current = job;
  while (!TERMINAL.includes(current.state)) {
    const polled = await gateway(`${job.poll_url}/wait?timeout=1000`);
    if (polled.status !== 200) { show(m, polled, params); return; }
    current = polled.body;
    badge($("#job-state"), current.state);
    $("#job-elapsed").textContent = `${(current.elapsed_ms / 1000).toFixed(1)} s`;
    showProgress(current);
  }
  if (current.state !== "done") { $("#try-error").textContent = `Job ${current.state}: ${current.error || ""}`; return; }
  const bar = $("#job-progress progress");
  if (!$("#job-progress").hidden) { // done: every step is
    bar.value = bar.max;
    $("#job-eta").textContent = `all ${bar.max} steps`;
  }
  show(m, await gateway(job.result_url), params);
}

function show(m, reply, params) {
  const raw = $("#try-raw");
  raw.hidden = false;
  raw.querySelector("pre").textContent = JSON.stringify(reply.body, null, 2);
  const env = reply.body || {};
  if (reply.status !== 200 || !env.results) {
    $("#try-error").textContent = `HTTP ${reply.status}: ${env.status_str || ""} ${env.error || ""}`;
    return;
  }
  if (env.model && env.model.version) {
    state.versions[m.id] = env.model.version;
    updateDemoBanner();
  }
  const out = $("#try-result");
  env.results.forEach((item, i) => {
    if (item.status !== 0) {
      const p = document.createElement("p");
      p.className = "error";
      p.textContent = `Item ${i}: status ${item.status} ${item.error || ""}`;
      out.appendChild(p);
      return;
    }
    const render = { classification: showClasses, detection: showBoxes, generation: showImage, segmentation: showMasks }[m.category];
    (render || (() => {}))(out, item.data, params || {});
  });
}

function showClasses(out, data) {
  if (!data || !(data.categories || data.category)) return; // nothing to draw: the raw JSON shows it
  const list = document.createElement("ol");
  list.className = "classes";
  const names = data.categories || [data.category];
  const scores = data.scores || [];
  names.forEach((name, i) => {
    const li = document.createElement("li");
    const label = document.createElement("span");
    label.textContent = name;
    if (i === 0) label.className = "top-class";
    const score = document.createElement("span");
    score.textContent = scores[i] !== undefined ? `${(scores[i] * 100).toFixed(2)} %` : "";
    const bar = document.createElement("div");
    bar.className = "bar";
    bar.style.width = `${Math.max(1, (scores[i] || 0) / (scores[0] || 1) * 100)}%`;
    li.append(label, score, bar);
    list.appendChild(li);
  });
  out.appendChild(list);
}

function withImage(callback) {
  const img = new Image();
  img.onload = () => callback(img);
  img.src = state.image;
}

function colour(i) {
  return `hsl(${(i * 67) % 360} 85% 45%)`;
}

function caption(text, className) {
  const p = document.createElement("p");
  p.className = className || "muted caption";
  p.textContent = text;
  return p;
}

// Boxes above the score threshold in force, at most DETECTION_MAX_RESULTS, each labelled, with a table beside.
function showBoxes(out, detections, params) {
  if (!state.image) return;
  const threshold = typeof params.score_threshold === "number" ? params.score_threshold : 0;
  const kept = (detections || []).filter((d) => d.score > threshold)
    .slice(0, DETECTION_MAX_RESULTS);
  const holder = document.createElement("div");
  holder.className = "result-row";
  out.appendChild(holder);
  out.appendChild(caption(`${kept.length} detection${kept.length === 1 ? "" : "s"} above score ${threshold}` +
    ` (at most ${DETECTION_MAX_RESULTS} shown)`));
  withImage((img) => {
    const canvas = document.createElement("canvas");
    canvas.width = img.naturalWidth;
    canvas.height = img.naturalHeight;
    canvas.className = "detections overlay";
    canvas.dataset.count = String(kept.length);
    const ctx = canvas.getContext("2d");
    ctx.drawImage(img, 0, 0);
    const line = Math.max(2, img.naturalWidth / 300);
    const size = Math.max(12, Math.round(img.naturalWidth / 45));
    ctx.lineWidth = line;
    ctx.font = `${size}px sans-serif`;
    ctx.textBaseline = "top";
    kept.forEach((d, i) => {
      const [x1, y1, x2, y2] = d.bbox;
      ctx.strokeStyle = colour(i);
      ctx.strokeRect(x1, y1, x2 - x1, y2 - y1);
      const label = `${i + 1} ${d.category} ${d.score.toFixed(2)}`;
      const w = ctx.measureText(label).width + 6;
      const ty = y1 - size - 4 >= 0 ? y1 - size - 4 : y1;
      ctx.fillStyle = colour(i);
      ctx.fillRect(x1, ty, w, size + 4);
      ctx.fillStyle = "#fff";
      ctx.fillText(label, x1 + 3, ty + 2);
    });
    holder.appendChild(canvas);
    const table = document.createElement("table");
    table.className = "detections-table";
    table.innerHTML = "<thead><tr><th></th><th>#</th><th>class</th><th>score</th><th>box (x1, y1, x2, y2)</th></tr></thead><tbody></tbody>";
    kept.forEach((d, i) => {
      const tr = document.createElement("tr");
      const swatch = document.createElement("i");
      swatch.style.background = colour(i);
      const cells = [swatch, String(i + 1), d.category, d.score.toFixed(3), d.bbox.map((v) => Math.round(v)).join(", ")];
      for (const c of cells) {
        const td = document.createElement("td");
        if (typeof c === "string") td.textContent = c; else td.appendChild(c);
        tr.appendChild(td);
      }
      table.tBodies[0].appendChild(tr);
    });
    holder.appendChild(table);
  });
}

// Generated images are small (16 to 64 pixels): scaled up by a whole factor, pixels kept sharp.
function showImage(out, data) {
  const img = document.createElement("img");
  const format = (data.format || "png").toLowerCase();
  const factor = Math.max(1, Math.floor(256 / Math.max(data.width || 256, data.height || 256)));
  img.src = `data:image/${format === "jpg" ? "jpeg" : format};base64,${data.image}`;
  img.alt = `generated ${data.width}x${data.height}, seed ${data.seed}`;
  img.className = "generated";
  img.width = data.width * factor;
  img.height = data.height * factor;
  out.appendChild(img);
  out.appendChild(caption(`${data.width}×${data.height} px, shown ×${factor}; seed ${data.seed}`));
}

// Each mask: a translucent fill in its own colour and an opaque outline; or a plain message when none.
function showMasks(out, masks) {
  if (!state.image) return;
  const pngs = (masks || []).filter((m) => typeof m.segmentation === "string"); // RLE: the raw JSON shows it
  if (!pngs.length) {
    out.appendChild(caption(`${(masks || []).length} masks at these thresholds`, "masks-none"));
    return;
  }
  out.appendChild(caption(`${pngs.length} mask${pngs.length === 1 ? "" : "s"}`, "muted caption masks-count"));
  withImage((img) => {
    const canvas = document.createElement("canvas");
    canvas.width = img.naturalWidth;
    canvas.height = img.naturalHeight;
    canvas.className = "masks overlay";
    canvas.dataset.count = String(pngs.length);
    const ctx = canvas.getContext("2d");
    ctx.drawImage(img, 0, 0);
    out.insertBefore(canvas, out.querySelector(".masks-count"));
    pngs.forEach((m, i) => {
      const mask = new Image();
      mask.onload = () => {
        const layer = document.createElement("canvas");
        const w = (layer.width = canvas.width);
        const h = (layer.height = canvas.height);
        const lctx = layer.getContext("2d");
        lctx.drawImage(mask, 0, 0, w, h);
        const pixels = lctx.getImageData(0, 0, w, h);
        const on = new Uint8Array(w * h);
        for (let p = 0; p < on.length; p += 1) on[p] = pixels.data[p * 4] > 127 ? 1 : 0;
        const [r, g, b] = hslToRgb(((i * 67) % 360) / 360, 0.85, 0.5);
        for (let p = 0; p < on.length; p += 1) {
          const x = p % w, y = (p - x) / w;
          const edge = on[p] && (x === 0 || y === 0 || x === w - 1 || y === h - 1 ||
                                 !on[p - 1] || !on[p + 1] || !on[p - w] || !on[p + w]);
          const q = p * 4;
          pixels.data[q] = r; pixels.data[q + 1] = g; pixels.data[q + 2] = b;
          pixels.data[q + 3] = edge ? 255 : on[p] ? 100 : 0;
        }
        lctx.putImageData(pixels, 0, 0);
        ctx.drawImage(layer, 0, 0);
        canvas.dataset.drawn = String(Number(canvas.dataset.drawn || 0) + 1);
      };
      mask.src = `data:image/png;base64,${m.segmentation}`;
    });
  });
}

function hslToRgb(h, s, l) {
  const f = (n) => { const k = (n + h * 12) % 12; const a = s * Math.min(l, 1 - l); return Math.round(255 * (l - a * Math.max(-1, Math.min(k - 3, 9 - k, 1)))); };
  return [f(0), f(8), f(4)];
}

// -- wiring ------------------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("#token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.token = $("#token-input").value.trim();
    localStorage.setItem(TOKEN_KEY, state.token);
    connect();
  });
  $("#forget").addEventListener("click", () => { localStorage.removeItem(TOKEN_KEY); state.token = ""; showLogin(); });
  document.body.addEventListener("click", (event) => {
    const button = event.target.closest("button[data-action]");
    if (button) act(button.dataset.target, button.dataset.action, button, button.dataset.replica);
  });
  $("#log-server").addEventListener("change", (event) => {
    state.logServer = event.target.value;
    state.logOffset = null;
    state.logLevels = {};
    $("#log-lines").textContent = "";
    followLogs().catch(() => {});
  });
  $("#try-model").addEventListener("change", modelChosen);
  $("#log-level").addEventListener("change", applyLogFilters);
  $("#log-filter").addEventListener("input", applyLogFilters);
  $("#try-file").addEventListener("change", (event) => takeFile(event.target.files[0]));
  const drop = $("#drop");
  drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => { event.preventDefault(); drop.classList.remove("over"); takeFile(event.dataTransfer.files[0]); });
  $("#try-run").addEventListener("click", run);
  if (state.token) connect(); else showLogin();
});
