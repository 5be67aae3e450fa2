// -- login: asking for the token, connecting, and the selects filled once connected.

import { $, state, TOKEN_KEY } from "./state.js";
import { api, HttpError } from "./api.js";
import { refresh, serverStatus } from "./status.js";
import { refreshSeries } from "./charts.js";
import { followLogs } from "./logs.js";
import { modelChosen } from "./try-it.js";

export function showLogin(message) {
  clearInterval(state.refreshTimer);
  clearInterval(state.logTimer);
  clearInterval(state.seriesTimer);
  $("#console").hidden = true;
  $("#login").hidden = false;
  $("#forget").hidden = true;
  $("#login-error").textContent = message || "";
  $("#token-input").focus();
}

// Whether the supervisor accepted the token; a refused one is forgotten, so that a reload asks again.
export async function connect() {
  try {
    await refresh();
  } catch (e) {
    if (e instanceof HttpError && e.status === 401) localStorage.removeItem(TOKEN_KEY);
    else showLogin(`Cannot reach the supervisor: ${e.message}`);
    return false;
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
  return true;
}

export function fillSelects() {
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
