// -- login: asking for the token, connecting (again, every few seconds, while the supervisor cannot be
// reached), the polling timers of a connected page, the stale mark when a refresh fails, and the
// selects filled once connected.

import { $, sendable, state, TOKEN_KEY } from "./state.js";
import { api, HttpError } from "./api.js";
import { refresh } from "./status.js";
import { refreshSeries } from "./charts.js";
import { fillLogSelect, followLogs } from "./logs.js";
import { modelChosen } from "./try-it.js";

export const RETRY_MS = 3000;

// Every timer of the page ends here, and the session count moves on: a reply to a request of the ended
// session (one in flight at "Forget token") is dropped by whoever checks it.
export function stopPolling() {
  for (const key of ["refreshTimer", "logTimer", "seriesTimer"]) { clearInterval(state[key]); state[key] = null; }
  clearTimeout(state.retryTimer);
  state.retryTimer = null;
  state.session += 1;
}

export function showLogin(message) {
  stopPolling();
  setOffline(null);
  $("#console").hidden = true;
  $("#login").hidden = false;
  $("#forget").hidden = true;
  $("#login-error").textContent = message || "";
  $("#token-input").focus();
}

// The token the supervisor refused (a wrong one, or one rotated while the page polled): forgotten, so
// that a reload asks again.
export function tokenRefused() {
  localStorage.removeItem(TOKEN_KEY);
  showLogin("The token was refused.");
}

// Connecting with the stored token (at load, or set by another tab). One that cannot be sent (stored by hand, or
// by a page that did not check) is said, with "Forget token": fetch threw on it, which read as "Cannot reach the
// supervisor; retrying…" for ever (a regression probe).
export function connectStored() {
  if (sendable(state.token)) return connect();
  showLogin("The stored token cannot be sent: it is not printable ASCII. Forget it, or connect with another.");
  $("#forget").hidden = false;
  return Promise.resolve(false);
}

// Whether the supervisor accepted the token. One connect at a time: a double click on Connect, or Enter
// while it runs, would start a second set of timers that no later showLogin could stop.
export async function connect() {
  if (state.connecting) return false;
  state.connecting = true;
  const button = $("#token-form button");
  button.disabled = true;
  try {
    return await connectOnce();
  } finally {
    state.connecting = false;
    button.disabled = false;
  }
}

async function connectOnce() {
  stopPolling();
  const session = state.session;
  try {
    await refresh();
    state.catalog = (await api("/api/v1/catalog")).models;
  } catch (e) {
    if (e instanceof HttpError && e.status === 401) return false; // api() has shown the login
    if (session !== state.session) return false;
    // A refusal of the request itself (a token too long for a header: 431) is said, and not sent again every
    // few seconds: "Cannot reach the supervisor; retrying" was not true, and the retries never ended.
    if (e instanceof HttpError && e.status >= 400 && e.status < 500 && e.status !== 408 && e.status !== 429) {
      showLogin(`The supervisor refused the request: HTTP ${e.status} (${e.message}).`);
      $("#forget").hidden = !localStorage.getItem(TOKEN_KEY); // a stored token it refuses can be forgotten
      return false;
    }
    // Unreachable (the supervisor restarting, the page loaded before it), or an answer that may change (a 503
    // past its connection limit): the token is kept and tried again.
    showLogin(e instanceof HttpError ? `The supervisor answered HTTP ${e.status}; retrying…`
                                     : "Cannot reach the supervisor; retrying…");
    $("#forget").hidden = !localStorage.getItem(TOKEN_KEY);
    state.retryTimer = setTimeout(connect, RETRY_MS);
    return false;
  }
  if (session !== state.session) return false; // "Forget token" meanwhile
  localStorage.setItem(TOKEN_KEY, state.token); // kept only once the supervisor has accepted it
  $("#login").hidden = true;
  $("#console").hidden = false;
  $("#forget").hidden = false;
  // The Connect button or the token field (Enter) that had the focus is hidden: the console takes it, not the
  // page's body. A field just hidden may still be the active element until the browser moves the focus away.
  const active = document.activeElement;
  if (!active || active === document.body || $("#login").contains(active)) $("#console").focus();
  fillSelects();
  state.refreshTimer = setInterval(oneAtATime(poll), 2000);
  state.logTimer = setInterval(oneAtATime(followLogs), 1500);
  const series = oneAtATime(refreshSeries);
  series();
  state.seriesTimer = setInterval(series, 5000);
  return true;
}

// ``task`` for a timer: a tick while the previous call still waits for its reply does nothing, so that a
// slow or hung supervisor is never sent a pile of requests (they all arrived at once when it woke up).
// A call's failure is the task's to show (poll marks the page stale); here it only ends the call.
export function oneAtATime(task) {
  let busy = false;
  return async () => {
    if (busy) return;
    busy = true;
    try { await task(); } catch (e) { /* shown by the task, or by the next refresh */ } finally { busy = false; }
  };
}

// The status refresh of a connected page: a failure other than a refused token (that one shows the
// login) marks what the page shows as stale until a refresh succeeds.
export async function poll() {
  const session = state.session;
  // A refresh that fails at its 10 s timeout (a hung supervisor) has failed since it was asked, not since then.
  const asked = new Date();
  try {
    const status = await refresh();
    if (session !== state.session) return;
    setOffline(null);
    await followCatalog(status, session);
  } catch (e) {
    if (session === state.session && !(e instanceof HttpError && e.status === 401)) setOffline(e, asked);
  }
}

const modelIds = (list) => list.map((m) => m.id).sort().join(" ");

// A supervisor restarted with other models (a config added or removed) while the page was open: the
// catalog is read again, so that the log view and "Try it" offer what is served now (a model added could
// not be chosen until a reload).
async function followCatalog(status, session) {
  if (modelIds(status.servers) === modelIds(state.catalog)) return;
  const models = (await api("/api/v1/catalog")).models;
  if (session !== state.session) return;
  state.catalog = models;
  fillSelects();
}

// The banner and the stale mark while the status refreshes fail; the action buttons are disabled meanwhile
// (a click on a greyed page reached a hung supervisor when it woke, a restart nobody expected any more). Once a
// refresh succeeds, it has set the table's buttons again (status.js fillRow); the gateway's is set here.
export function setOffline(error, since = new Date()) {
  const banner = $("#offline");
  $("#console").classList.toggle("stale", Boolean(error));
  banner.hidden = !error;
  if (!error) {
    state.offlineSince = null;
    $("#gateway-panel button[data-action]").disabled = state.busy.has("__gateway");
    return;
  }
  for (const button of document.querySelectorAll("#console button[data-action]")) button.disabled = true;
  if (!state.offlineSince) state.offlineSince = since;
  banner.textContent = `Cannot reach the supervisor since ${clock(state.offlineSince)}; retrying`;
  banner.title = error.message;
}

// HH:MM:SS in the browser's time zone, whatever its locale.
export function clock(date) {
  return [date.getHours(), date.getMinutes(), date.getSeconds()].map((n) => String(n).padStart(2, "0")).join(":");
}

// The log view's and "Try it"'s lists, from the catalog; a model chosen in "Try it" stays chosen (and its
// form as it is) while the catalog still has it.
export function fillSelects() {
  fillLogSelect();
  const trySelect = $("#try-model");
  const chosen = trySelect.value;
  trySelect.innerHTML = "";
  for (const m of state.catalog) trySelect.add(new Option(`${m.id} (${m.task || m.category || "?"}${m.async ? ", async" : ""})`, m.id));
  $("#try-run").disabled = false;
  if (state.catalog.some((m) => m.id === chosen)) { trySelect.value = chosen; return; }
  const classifier = state.catalog.find((m) => m.category === "classification");
  if (classifier) trySelect.value = classifier.id;
  modelChosen();
}
