// The supervisor's operator page: plain JS, no build step.
// Talks to the management API (same origin) and to the gateway's data plane
// (its port, CORS) with the management token kept in localStorage.
"use strict";

const TOKEN_KEY = "inference-service.token";
const PLACEHOLDER_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
const TERMINAL = ["done", "failed", "timeout"];
const $ = (sel) => document.querySelector(sel);

const state = { token: localStorage.getItem(TOKEN_KEY) || "", status: null, catalog: [], busy: new Set(),
                logServer: null, logOffset: null, image: null, imageB64: null, refreshTimer: null, logTimer: null };

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
  return status;
}

function renderServers(servers) {
  const tbody = $("#catalog tbody");
  for (const s of servers) {
    let row = tbody.querySelector(`tr[data-id="${s.id}"]`);
    if (!row) {
      row = document.createElement("tr");
      row.dataset.id = s.id;
      row.innerHTML = `<td class="id"></td><td class="task"></td><td><span class="state badge"></span></td>
        <td class="ready"></td><td class="restarts"></td><td class="port"></td><td class="last-error"></td>
        <td class="actions"><button data-action="start">Start</button> <button data-action="stop">Stop</button>
        <button data-action="restart">Restart</button></td>`;
      for (const button of row.querySelectorAll("button")) button.dataset.target = s.id;
      tbody.appendChild(row);
    }
    row.querySelector(".id").textContent = s.id + (s.in_profile ? "" : " (not in profile)");
    row.querySelector(".task").textContent = `${s.task || ""}${s.async ? " · async" : ""}`;
    badge(row.querySelector(".state"), s.state);
    row.dataset.state = s.state;
    row.dataset.ready = String(s.ready);
    row.querySelector(".ready").textContent = s.ready ? "yes" : "no";
    row.querySelector(".restarts").textContent = s.restarts;
    row.querySelector(".port").textContent = s.port;
    const err = row.querySelector(".last-error");
    err.textContent = s.last_error || "";
    err.title = s.last_error || "";
    const busy = state.busy.has(s.id);
    const active = ["starting", "running", "stopping"].includes(s.state);
    row.querySelector('[data-action="start"]').disabled = busy || active;
    row.querySelector('[data-action="stop"]').disabled = busy || !["starting", "running", "backoff"].includes(s.state);
    row.querySelector('[data-action="restart"]').disabled = busy || s.state === "stopping";
  }
}

async function act(target, action, button) {
  const label = target === "__gateway" ? "gateway" : target;
  state.busy.add(target);
  button.disabled = true;
  const message = $("#action-message");
  message.className = "muted";
  message.textContent = `${label}: ${action} requested…`;
  try {
    await api(`/api/v1/servers/${encodeURIComponent(target)}/${action}`, { method: "POST" });
    message.textContent = `${label}: ${action} done`;
  } catch (e) {
    message.className = "error";
    message.textContent = `${label}: ${action} failed: ${e.message}`;
  } finally {
    state.busy.delete(target);
    button.disabled = false;
    refresh().catch(() => {});
  }
}

// -- logs ----------------------------------------------------------------------------------------

function fillSelects() {
  const logSelect = $("#log-server");
  logSelect.innerHTML = "";
  for (const id of ["__gateway", ...state.catalog.map((m) => m.id)]) {
    logSelect.add(new Option(id === "__gateway" ? "gateway" : id, id));
  }
  state.logServer = logSelect.value;
  const trySelect = $("#try-model");
  trySelect.innerHTML = "";
  for (const m of state.catalog) trySelect.add(new Option(`${m.id} (${m.task || m.category || "?"}${m.async ? ", async" : ""})`, m.id));
  $("#try-run").disabled = false;
  suggestParams();
}

async function followLogs() {
  if (!$("#log-follow").checked || !state.logServer) return;
  const query = state.logOffset === null ? "limit=200" : `offset=${state.logOffset}&limit=500`;
  const page = await api(`/api/v1/servers/${encodeURIComponent(state.logServer)}/logs?${query}`);
  const pre = $("#log-lines");
  const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  for (const line of page.lines) {
    const span = document.createElement("span");
    span.className = line.stream;
    span.textContent = line.line + "\n";
    pre.appendChild(span);
  }
  while (pre.childNodes.length > 2000) pre.removeChild(pre.firstChild);
  state.logOffset = page.next_offset;
  if (atBottom) pre.scrollTop = pre.scrollHeight;
}

// -- try it ----------------------------------------------------------------------------------------

function selectedModel() {
  return state.catalog.find((m) => m.id === $("#try-model").value);
}

function suggestParams() {
  const m = selectedModel();
  const examples = { classification: '{"top_k": 5}', detection: '{"score_threshold": 0.25}',
                     generation: '{"timesteps": 20, "seed": 1}', segmentation: '{"points_per_side": 8}' };
  $("#try-params").placeholder = (m && examples[m.category]) || "{}";
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
  if (text) body.params = JSON.parse(text);
  if (!state.imageB64 && m && m.category !== "generation") throw new Error("choose or drop an image first");
  return body;
}

async function run() {
  const m = selectedModel();
  $("#try-error").textContent = "";
  $("#try-result").innerHTML = "";
  $("#try-raw").hidden = true;
  $("#job").hidden = true;
  let body;
  try { body = requestBody(); } catch (e) { $("#try-error").textContent = e.message; return; }
  $("#try-run").disabled = true;
  try {
    if (m.async) await runJob(m, body); else show(m, await gateway(`/v1/models/${m.id}/infer`, { method: "POST", body: JSON.stringify(body) }));
  } catch (e) {
    $("#try-error").textContent = `Request failed: ${e.message} (is the gateway running, and does it allow this page's origin?)`;
  } finally {
    $("#try-run").disabled = false;
  }
}

async function runJob(m, body) {
  const submitted = await gateway(`/v1/models/${m.id}/jobs`, { method: "POST", body: JSON.stringify(body) });
  if (submitted.status !== 202) { show(m, submitted); return; }
  const job = submitted.body;
  $("#job").hidden = false;
  $("#job-id").textContent = job.job_id;
  badge($("#job-state"), job.state);
  let current = job;
  while (!TERMINAL.includes(current.state)) {
    const polled = await gateway(`${job.poll_url}/wait?timeout=1000`);
    if (polled.status !== 200) { show(m, polled); return; }
    current = polled.body;
    badge($("#job-state"), current.state);
    $("#job-elapsed").textContent = `${(current.elapsed_ms / 1000).toFixed(1)} s`;
  }
  if (current.state !== "done") { $("#try-error").textContent = `Job ${current.state}: ${current.error || ""}`; return; }
  show(m, await gateway(job.result_url));
}

function show(m, reply) {
  const raw = $("#try-raw");
  raw.hidden = false;
  raw.querySelector("pre").textContent = JSON.stringify(reply.body, null, 2);
  const env = reply.body || {};
  if (reply.status !== 200 || !env.results) {
    $("#try-error").textContent = `HTTP ${reply.status}: ${env.status_str || ""} ${env.error || ""}`;
    return;
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
    (render || (() => {}))(out, item.data);
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

function showBoxes(out, detections) {
  if (!state.image) return;
  withImage((img) => {
    const canvas = document.createElement("canvas");
    canvas.width = img.naturalWidth;
    canvas.height = img.naturalHeight;
    const ctx = canvas.getContext("2d");
    ctx.drawImage(img, 0, 0);
    ctx.lineWidth = Math.max(2, img.naturalWidth / 300);
    ctx.font = `${Math.max(12, img.naturalWidth / 50)}px sans-serif`;
    (detections || []).forEach((d, i) => {
      const [x1, y1, x2, y2] = d.bbox;
      ctx.strokeStyle = ctx.fillStyle = `hsl(${(i * 67) % 360} 85% 50%)`;
      ctx.strokeRect(x1, y1, x2 - x1, y2 - y1);
      ctx.fillText(`${d.category} ${(d.score * 100).toFixed(0)}%`, x1 + 2, Math.max(12, y1 - 4));
    });
    canvas.className = "detections";
    out.appendChild(canvas);
  });
}

function showImage(out, data) {
  const img = document.createElement("img");
  const format = (data.format || "png").toLowerCase();
  img.src = `data:image/${format === "jpg" ? "jpeg" : format};base64,${data.image}`;
  img.alt = `generated ${data.width}x${data.height}, seed ${data.seed}`;
  img.className = "generated";
  out.appendChild(img);
  const caption = document.createElement("p");
  caption.className = "muted";
  caption.textContent = `${data.width}×${data.height}, seed ${data.seed}`;
  out.appendChild(caption);
}

function showMasks(out, masks) {
  if (!state.image) return;
  withImage((img) => {
    const canvas = document.createElement("canvas");
    canvas.width = img.naturalWidth;
    canvas.height = img.naturalHeight;
    const ctx = canvas.getContext("2d");
    ctx.drawImage(img, 0, 0);
    out.appendChild(canvas);
    (masks || []).forEach((m, i) => {
      if (typeof m.segmentation !== "string") return; // RLE: shown in the raw JSON only
      const mask = new Image();
      mask.onload = () => {
        const layer = document.createElement("canvas");
        layer.width = canvas.width;
        layer.height = canvas.height;
        const lctx = layer.getContext("2d");
        lctx.drawImage(mask, 0, 0, layer.width, layer.height);
        const pixels = lctx.getImageData(0, 0, layer.width, layer.height);
        const hue = (i * 67) % 360;
        const [r, g, b] = hslToRgb(hue / 360, 0.85, 0.5);
        for (let p = 0; p < pixels.data.length; p += 4) {
          const on = pixels.data[p] > 127;
          pixels.data[p] = r; pixels.data[p + 1] = g; pixels.data[p + 2] = b; pixels.data[p + 3] = on ? 110 : 0;
        }
        lctx.putImageData(pixels, 0, 0);
        ctx.drawImage(layer, 0, 0);
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
    if (button) act(button.dataset.target, button.dataset.action, button);
  });
  $("#log-server").addEventListener("change", (event) => {
    state.logServer = event.target.value;
    state.logOffset = null;
    $("#log-lines").textContent = "";
    followLogs().catch(() => {});
  });
  $("#try-model").addEventListener("change", suggestParams);
  $("#try-file").addEventListener("change", (event) => takeFile(event.target.files[0]));
  const drop = $("#drop");
  drop.addEventListener("dragover", (event) => { event.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (event) => { event.preventDefault(); drop.classList.remove("over"); takeFile(event.dataTransfer.files[0]); });
  $("#try-run").addEventListener("click", run);
  if (state.token) connect(); else showLogin();
});
