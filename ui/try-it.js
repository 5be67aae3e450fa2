// -- try it: a model, its params' defaults, an image, the request (or a job with its progress),
// and the reply drawn by results.js.

import { $, state } from "./state.js";
import { api, gateway } from "./api.js";
import { badge, weightsLabel } from "./status.js";
import { DETECTION_MAX_RESULTS, showBoxes, showClasses, showImage, showMasks } from "./results.js";

export const PLACEHOLDER_PNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
export const TERMINAL = ["done", "failed", "timeout"];

export function selectedModel() {
  return state.catalog.find((m) => m.id === $("#try-model").value);
}

export function clearResult() {
  $("#try-error").textContent = "";
  $("#try-result").innerHTML = "";
  $("#try-raw").hidden = true;
  $("#job").hidden = true;
  $("#job-progress").hidden = true;
}

export function clearImage() {
  state.image = null;
  state.imageB64 = null;
  $("#try-file").value = "";
  const preview = $("#try-preview");
  preview.removeAttribute("src");
  preview.hidden = true;
}

// Whether the model reads no photo: its plugin's needs_image is false (a diffusion model). An image-to-image
// model of category generation reads one, so the category alone does not decide.
export function takesNoPhoto(m) {
  return Boolean(m) && m.needs_image === false;
}

// A new model starts from a clean form: its own defaults, no result; a model that reads no photo asks for none.
// A run of the model chosen before is dropped (see isCurrent): its reply belongs to another form.
export function modelChosen() {
  const m = selectedModel();
  state.run += 1;
  $("#try-run").disabled = false;
  clearResult();
  $("#try-params").value = "";
  const note = $("#try-note");
  if (takesNoPhoto(m)) {
    clearImage();
    note.textContent = m.category === "generation"
      ? `${m.id} generates an image from noise: the pixels of a photo are ignored, so none is needed.`
      : `${m.id} ignores the pixels of a photo, so none is needed.`;
    note.hidden = false;
    $("#drop").hidden = true;
  } else {
    note.hidden = true;
    $("#drop").hidden = false;
  }
  updateDemoBanner();
  if (!m) return;
  // A model not running gets its defaults from defaultsWhenRunning, once it runs.
  if (state.defaults[m.id] || runs(m)) loadDefaults(m).catch(() => {});
  else $("#try-params").placeholder = NOT_RUNNING;
}

export function updateDemoBanner() {
  const m = selectedModel();
  const weights = m ? weightsLabel(m.id) : null;
  $("#try-demo").hidden = !(weights && weights.demo);
}

export const NOT_RUNNING = "{} (the model's defaults: it is not running)";

// Whether the model runs and answers, as the last status refresh saw it: only then is its OpenAPI document
// asked for (the supervisor answers 503 for a model that is not running, and the browser logs that as an error).
export function runs(m) {
  const server = state.status && state.status.servers.find((s) => s.id === m.id);
  return Boolean(server && server.state === "running" && (server.ready || (server.replicas || []).some((r) => r.ready)));
}

// The chosen model's defaults once it runs, when it was not running as it was chosen (stopped, or still
// starting when the page connected), or once it runs again after a restart: called by every status refresh,
// it asks only then, once.
export function defaultsWhenRunning() {
  const m = selectedModel();
  if (!m || state.defaults[m.id] || state.loadingDefaults) return;
  if (runs(m)) loadDefaults(m).catch(() => {});
}

// Which processes serve a model: a restart (a new pid, one more restart) or a state other than running
// means they may run another config, whose params' defaults differ.
function processKey(s) {
  return JSON.stringify([s.state, s.pid, s.restarts, (s.replicas || []).map((r) => [r.state, r.pid, r.restarts])]);
}

// Called by every status refresh: a model whose processes changed forgets its defaults (they were kept for
// the page's life, and a model restarted with another config showed the old ones), and defaultsWhenRunning
// reads them again once it runs.
export function forgetChangedDefaults(servers) {
  for (const s of servers) {
    const key = processKey(s);
    if (state.processKeys[s.id] !== undefined && state.processKeys[s.id] !== key && state.defaults[s.id]) {
      delete state.defaults[s.id];
      const m = selectedModel();
      if (m && m.id === s.id) $("#try-params").placeholder = NOT_RUNNING;
    }
    state.processKeys[s.id] = key;
  }
}

// The params' defaults as the running model server states them in its OpenAPI document.
export async function loadDefaults(m) {
  const input = $("#try-params");
  if (!state.defaults[m.id]) {
    input.placeholder = "loading the defaults…";
    state.loadingDefaults = true;
    const key = state.processKeys[m.id];
    const reply = await api(`/api/v1/servers/${encodeURIComponent(m.id)}/openapi`).catch(() => null)
      .finally(() => { state.loadingDefaults = false; });
    // Processes that changed meanwhile may have answered with their old config: a refresh asks again once it runs.
    if (state.processKeys[m.id] !== key) {
      if (selectedModel() === m) input.placeholder = NOT_RUNNING;
      return;
    }
    const schema = reply && reply.openapi.components && reply.openapi.components.schemas[`${m.id}_Params`];
    if (!schema) {
      if (selectedModel() === m) input.placeholder = NOT_RUNNING;
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

export function takeFile(file) {
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

export function requestBody() {
  const m = selectedModel();
  const body = { images: [state.imageB64 || PLACEHOLDER_PNG] };
  const text = $("#try-params").value.trim();
  if (text) {
    try { body.params = JSON.parse(text); } catch (e) { throw new Error(`params are not JSON: ${e.message}`); }
  }
  if (m && (m.category === "detection" || m.category === "segmentation")) body.options = { max_results: DETECTION_MAX_RESULTS };
  if (!state.imageB64 && m && !takesNoPhoto(m)) throw new Error("choose or drop an image first");
  return body;
}

// The params in force: the box's, else the defaults the placeholder shows.
export function effectiveParams(m, body) {
  return { ...(state.defaults[m.id] || {}), ...(body.params || {}) };
}

// Whether the run numbered `id` is still the form's: no other model was chosen since it started.
function isCurrent(id) {
  return state.run === id;
}

export async function run() {
  const m = selectedModel();
  clearResult();
  let body;
  try { body = requestBody(); } catch (e) { $("#try-error").textContent = e.message; return; }
  state.run += 1;
  const id = state.run;
  $("#try-run").disabled = true;
  try {
    const params = effectiveParams(m, body);
    if (m.async) await runJob(m, body, params, id);
    else {
      const reply = await gateway(`/v1/models/${m.id}/infer`, { method: "POST", body: JSON.stringify(body) });
      if (isCurrent(id)) show(m, reply, params);
    }
  } catch (e) {
    if (isCurrent(id)) $("#try-error").textContent = `Request failed: ${e.message} (is the gateway running, and does it allow this page's origin?)`;
  } finally {
    if (isCurrent(id)) $("#try-run").disabled = false;
  }
}

export function showProgress(current) {
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

// The job is followed until it ends, or until another model is chosen (the job runs on, unwatched).
export async function runJob(m, body, params, id) {
  const submitted = await gateway(`/v1/models/${m.id}/jobs`, { method: "POST", body: JSON.stringify(body) });
  if (!isCurrent(id)) return;
  if (submitted.status !== 202) { show(m, submitted, params); return; }
  const job = submitted.body;
  $("#job").hidden = false;
  $("#job-id").textContent = job.job_id;
  $("#job-elapsed").textContent = "";
  badge($("#job-state"), job.state);
  let current = job;
  while (!TERMINAL.includes(current.state)) {
    const polled = await gateway(`${job.poll_url}/wait?timeout=1000`);
    if (!isCurrent(id)) return;
    if (polled.status !== 200) { // lost with its model server (502, 503, 404): not running any more, no ETA
      badge($("#job-state"), `unknown (HTTP ${polled.status})`);
      $("#job-eta").textContent = $("#job-eta").textContent.replace(/ · about .* left$/, "");
      show(m, polled, params);
      return;
    }
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
  const result = await gateway(job.result_url);
  if (isCurrent(id)) show(m, result, params);
}

export function show(m, reply, params) {
  const raw = $("#try-raw");
  raw.hidden = false;
  raw.querySelector("pre").textContent = JSON.stringify(reply.body, null, 2);
  const env = reply.body || {};
  if (reply.status !== 200 || !env.results) {
    $("#try-error").textContent = replyError(reply.status, env);
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

// A refused request in one line: the HTTP code, the status, and the reason, which is the envelope's
// `error` or, for an item that failed (a bad image: 400 INVALID_IMAGE), that item's own.
export function replyError(code, env) {
  const items = (env.results || []).filter((r) => r && r.status !== 0 && r.error).map((r) => r.error);
  const reason = [env.error, ...items].filter(Boolean).join("; ");
  const text = [env.status_str, reason].filter(Boolean).join(": ");
  return `HTTP ${code}${text ? `: ${text}` : ""}`;
}
