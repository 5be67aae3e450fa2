// -- status: the gateway and the model servers (a row per model, one per replica of a model that
// runs several), their weights, and the start/stop/restart buttons.

import { $, state } from "./state.js";
import { api, gatewayBase } from "./api.js";
import { defaultsWhenRunning, forgetChangedDefaults, updateDemoBanner } from "./try-it.js";
import { fillLogSelect, supervisorSeen } from "./logs.js";

export function badge(el, text) {
  // The colour comes from data-tone, so the element keeps its own classes (".state" in the table).
  el.textContent = text;
  el.dataset.tone = text.split(" ")[0];
}

export async function refresh() {
  const status = await api("/api/v1/status", { poll: true });
  state.status = status;
  supervisorSeen(status.pid);
  $("#summary").textContent = `version ${status.version} · profile ${status.profile} · device ${status.device}`;
  const gw = status.gateway;
  badge($("#gateway-state"), gw.state + (gw.state === "running" ? (gw.ready ? " · ready" : " · not ready") : ""));
  $("#gateway-state").dataset.state = gw.state;
  $("#gateway-url").textContent = gatewayBase();
  showLastError($("#gateway-error"), gw);
  renderServers(status.servers);
  updateDemoBanner();
  forgetChangedDefaults(status.servers);
  defaultsWhenRunning();
  return status;
}

export function renderServers(servers) {
  const tbody = $("#catalog tbody");
  let reshaped = false;
  // A model no longer served (a supervisor restarted without its config) loses its rows: they stayed, frozen.
  const ids = new Set(servers.map((s) => s.id));
  for (const row of [...tbody.querySelectorAll("tr.model")]) {
    if (ids.has(row.dataset.id)) continue;
    for (const r of rowsOf(row)) r.remove();
    reshaped = true;
  }
  for (const s of servers) {
    const replicas = s.replicas || [];
    const several = replicas.length > 1;
    // The processes the rows are for: a supervisor restarted with another replica count changes them.
    const shape = several ? replicas.map((r) => r.name).join(" ") : "";
    let row = tbody.querySelector(`tr.model[data-id="${s.id}"]`);
    if (!row || row.dataset.shape !== shape) {
      const rows = modelRows(s.id, several ? replicas : []);
      rows[0].dataset.shape = shape;
      if (row) {
        const old = rowsOf(row);
        tbody.insertBefore(rowsFragment(rows), old[old.length - 1].nextSibling);
        for (const r of old) r.remove();
        reshaped = true;
      } else tbody.appendChild(rowsFragment(rows));
      row = rows[0];
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
    const task = row.querySelector(".task");
    task.textContent = `${s.task || ""}${s.async ? " · async" : ""}`;
    if (s.ready && state.modes[s.id]) { // the execution mode its model server reports (backend.optimize)
      const mode = document.createElement("span");
      mode.className = "mode muted small";
      mode.textContent = ` · ${state.modes[s.id]}`;
      mode.title = "execution mode (backend.optimize; with auto, the one it measured fastest)";
      task.appendChild(mode);
    }
    fillRow(row, s, several ? replicas.map((r) => r.port).join(", ") : s.port, several ? replicas : [s]);
    for (const r of several ? replicas : []) {
      const sub = tbody.querySelector(`tr.replica[data-id="${s.id}"][data-replica="${r.index}"]`);
      if (!sub) continue;
      const pinned = [r.gpu !== null && r.gpu !== undefined ? `GPU ${r.gpu}` : "", r.cpus ? `CPUs ${r.cpus.join(",")}` : ""];
      sub.querySelector(".task").textContent = pinned.filter(Boolean).join(" · ");
      fillRow(sub, r, r.port, [r]);
    }
  }
  if (reshaped) fillLogSelect(); // a replica's log to choose, or one no more
}

// A model's rows: its own, then its charts' when it runs one process, else each replica's row and charts'.
function modelRows(id, replicas) {
  const rows = [serverRow(id, null)];
  if (!replicas.length) rows.push(figuresRow(id));
  for (const r of replicas) rows.push(serverRow(id, r.index), figuresRow(r.name));
  return rows;
}

function rowsFragment(rows) {
  const fragment = document.createDocumentFragment();
  fragment.append(...rows);
  return fragment;
}

// The rows modelRows made for the model of `row`: up to the next model's.
function rowsOf(row) {
  const rows = [row];
  for (let next = row.nextElementSibling; next && !next.classList.contains("model"); next = next.nextElementSibling) rows.push(next);
  return rows;
}

// A row of the table: a model (replica null) or one replica of a model, with its buttons.
export function serverRow(id, replica) {
  const row = document.createElement("tr");
  row.className = replica === null ? "model" : "replica";
  row.dataset.id = id;
  if (replica !== null) row.dataset.replica = String(replica);
  row.innerHTML = `<td class="id"></td><td class="task"></td><td><span class="state badge"></span><span class="phase muted small"></span></td>
    <td class="ready"></td><td class="restarts"></td><td class="port"></td><td class="last-error"></td>
    <td class="actions"><button data-action="start">Start</button> <button data-action="stop">Stop</button>
    <button data-action="restart">Restart</button></td>`;
  if (replica !== null) row.querySelector(".id").textContent = `replica ${replica}`;
  for (const button of row.querySelectorAll("button")) {
    button.dataset.target = id;
    if (replica !== null) button.dataset.replica = String(replica);
    // Every row has the same three words: a screen reader says which row's button it is.
    button.setAttribute("aria-label", `${button.textContent} ${id}${replica === null ? "" : ` replica ${replica}`}`);
  }
  return row;
}

export function figuresRow(name) {
  const figures = document.createElement("tr");
  figures.className = "figures";
  figures.dataset.for = name;
  figures.innerHTML = `<td colspan="8"><div class="charts"></div></td>`;
  return figures;
}

// State (with the phase a starting model reports), readiness, restarts, port, last error and which buttons
// apply; `members` are the processes the row's actions act on (the replicas of a model, or the row's own process).
export function fillRow(row, s, port, members) {
  badge(row.querySelector(".state"), s.state);
  row.dataset.state = s.state;
  const phase = row.querySelector(".phase");
  phase.textContent = s.phase ? ` — ${phaseText(s.phase)}` : "";
  phase.title = s.phase || "";
  row.dataset.ready = String(s.ready);
  row.querySelector(".ready").textContent = s.ready ? "yes" : "no";
  row.querySelector(".restarts").textContent = s.restarts;
  row.querySelector(".port").textContent = port;
  showLastError(row.querySelector(".last-error"), s);
  const replica = row.dataset.replica;
  const busy = state.busy.has(row.dataset.id) || (replica !== undefined && state.busy.has(`${row.dataset.id}/${replica}`));
  const active = (m) => ["starting", "running", "stopping"].includes(m.state);
  row.querySelector('[data-action="start"]').disabled = busy || members.every(active);
  row.querySelector('[data-action="stop"]').disabled = busy || !members.some((m) => ["starting", "running", "backoff"].includes(m.state));
  row.querySelector('[data-action="restart"]').disabled = busy || members.some((m) => m.state === "stopping");
}

// An error as the table's narrow cell shows it: each file path of more than two folders cut to its last folder
// and file ("/home/me/models/v2/weights.pth: missing tensor" -> "…/v2/weights.pth: missing tensor"), so that
// the reason after it is in view (a probe: a long path filled the cell); a request's path after its method
// ("GET /v1/models/...") stays whole; the whole text is the cell's title.
export function shortPaths(text) {
  return text.replace(/(^|[\s(=])\/(?:[^\s\/:]+\/){2,}([^\s\/:]+\/[^\s\/:]+)/g, (path, before, end, at) =>
    /\b(?:GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS)\s$/.test(text.slice(0, at + before.length)) ? path : `${before}…/${end}`);
}

// A process's last error: a fault while it is not running; once it runs again (respawned after a crash, the
// API keeps `last_error`), shown muted as what happened before, not in red as a fault of now.  A model of
// several replicas says whose error it is ("replica 1: ..."): that replica's state decides, not the model's
// (a replica that could not start was shown muted, "earlier:", while the other kept the model running).
export function showLastError(el, s) {
  const named = /^replica (\d+): /.exec(s.last_error || "");
  const owner = named && (s.replicas || []).find((r) => String(r.index) === named[1]);
  const earlier = Boolean(s.last_error) && (owner || s).state === "running";
  el.textContent = s.last_error ? `${earlier ? "earlier: " : ""}${shortPaths(s.last_error)}` : "";
  el.title = earlier ? `running again since: ${s.last_error}` : s.last_error || "";
  el.classList.toggle("earlier", earlier);
}

// What a starting model says it does (its /ready's 503 reason, the status's `phase`), without the
// "the model is loading: " every phase starts with: "measuring mode 2 of 4 (compile)".
export function phaseText(phase) {
  return phase.replace(/^the model is loading: /, "");
}

// -- weights ---------------------------------------------------------------------------------

export function serverStatus(id) {
  return state.status ? state.status.servers.find((s) => s.id === id) : null;
}

// The model a process belongs to: the series name a process by its supervisor name (the model's id, or
// "<ID>.<n>" for replica n of a model that runs several).
export function modelOf(name) {
  const s = state.status && state.status.servers.find((x) => (x.replicas || []).some((r) => r.name === name));
  return s ? s.id : name;
}

// What the page knows about a model's weights: the status's `weights` field when the supervisor
// reports it, else the version the model server reports (random-init-seed<N> for demo weights).
export function weightsLabel(id) {
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

// A model's restart is rolling (one replica at a time); a replica's acts on that process alone.
export async function act(target, action, button, replica) {
  const one = replica !== undefined;
  const label = (target === "__gateway" ? "gateway" : target) + (one ? ` replica ${replica}` : "");
  // Said beside the button that asked it: a refused gateway restart was told below the model table, out of view.
  const message = $(target === "__gateway" ? "#gateway-message" : "#action-message");
  if (stale()) { // its buttons are disabled (setOffline): an action sent now would run whenever it woke
    message.className = "error";
    message.textContent = `${label}: not sent: the supervisor cannot be reached; try again once it answers`;
    return;
  }
  const key = one ? `${target}/${replica}` : target;
  state.busy.add(key);
  button.disabled = true;
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
    button.disabled = stale();
    refresh().catch(() => {});
  }
}

// Whether the page shows what it last knew (its status refreshes fail: session.js setOffline).
export function stale() {
  return $("#console").classList.contains("stale");
}
