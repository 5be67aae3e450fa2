// -- logs: any child's output, followed, with a level and a text filter.

import { $, state } from "./state.js";
import { api } from "./api.js";

export const LEVELS = ["debug", "info", "warn", "error", "critical"];

// The level of a line as `twist --log-format text` writes it ("... [namespace#warn] ..."); a line
// without one (a traceback, a print) takes the level of the line before it on the same stream, but
// Twisted's own lines that name no level ("... [-] (TCP Port 9101 Closed)") and blank ones are info:
// after a traceback they showed among the errors.
export function lineLevel(line, previous) {
  if (line.stream === "supervisor") return noteLevel(line.line);
  const match = /\[[^\]\s]*#(debug|info|warn|error|critical)\]/.exec(line.line);
  if (match) return match[1];
  if (!line.line.trim() || /^\S+ \[[^\]]*\] /.test(line.line)) return "info";
  return previous[line.stream] || (line.stream === "stderr" ? "error" : "info");
}

// A supervisor's note at the level its own output gives it: a failed start or a crash loop is an error;
// a crash's back-off, a model that stopped answering, a failed action, a closed socket, a log it cannot write a warning.
export function noteLevel(text) {
  if (/^(failed|start_failed):/.test(text)) return "error";
  if (/^(backoff:|not ready:|\w+ failed:|listening socket closed|cannot write )/.test(text)) return "warn";
  return "info";
}

export function logVisible(entry) {
  const floor = LEVELS.indexOf($("#log-level").value);
  const text = $("#log-filter").value.trim().toLowerCase();
  return LEVELS.indexOf(entry.level) >= floor && (!text || entry.line.toLowerCase().includes(text));
}

// The servers' logs to choose from: the gateway, each model, or each replica of a model that runs several.
// The log shown stays while it is still there (the select is filled again when the replicas change).
export function fillLogSelect() {
  const select = $("#log-server");
  select.replaceChildren(new Option("gateway", "__gateway"));
  for (const m of state.catalog) {
    const s = state.status ? state.status.servers.find((x) => x.id === m.id) : null;
    const replicas = s && s.replicas && s.replicas.length > 1 ? s.replicas : [];
    if (!replicas.length) select.add(new Option(m.id, m.id));
    for (const r of replicas) select.add(new Option(`${m.id} replica ${r.index}`, `${m.id}/${r.index}`));
  }
  if ([...select.options].some((o) => o.value === state.logServer)) {
    select.value = state.logServer;
    return;
  }
  state.logServer = select.value;
  state.logOffset = null;
  state.logLevels = {};
  $("#log-lines").textContent = "";
}

export function applyLogFilters() {
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

export async function followLogs() {
  if (!$("#log-follow").checked || !state.logServer) return;
  const query = state.logOffset === null ? "limit=500" : `offset=${state.logOffset}&limit=500`;
  // A model's replica is "ID/n" in the select: its own log (replicas/n/logs).
  const [id, replica] = state.logServer.split("/");
  const where = `/api/v1/servers/${encodeURIComponent(id)}${replica === undefined ? "" : `/replicas/${replica}`}`;
  const [server, from, epoch] = [state.logServer, state.logOffset, state.logEpoch];
  const page = await api(`${where}/logs?${query}`, { poll: true });
  // Another fetch (the 1.5 s timer, a change of server) may have run meanwhile: these lines are then
  // appended already, or another log's; a supervisor restarted meanwhile (a new epoch) sent the old log's.
  // Only a fetch from the offset and epoch still current appends.
  if (state.logServer !== server || state.logOffset !== from || state.logEpoch !== epoch) return;
  const pre = $("#log-lines");
  const atBottom = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
  state.logLevels = state.logLevels || {};
  for (const line of page.lines) {
    // A supervisor's note (a new process among them) ends what the lines before it carried over.
    if (line.stream === "supervisor") state.logLevels = {};
    const level = lineLevel(line, state.logLevels);
    state.logLevels[line.stream] = level;
    pre.appendChild(logLine(line.stream, level, line.line));
  }
  while (pre.childNodes.length > 2000) pre.removeChild(pre.firstChild);
  state.logOffset = page.next_offset;
  // The first page of a log is counted even when empty: a log chosen with no lines kept the last one's count.
  if (page.lines.length || from === null) showCount(pre);
  if (atBottom) pre.scrollTop = pre.scrollHeight;
}

function showCount(pre) {
  const shown = [...pre.children].filter((c) => !c.classList.contains("hidden")).length;
  $("#log-count").textContent = `${shown} of ${pre.children.length} lines`;
}

export const RESTARTED = "— the supervisor restarted: its log starts again —";

// The supervisor's pid as each status refresh reads it. A new pid is a new supervisor, whose logs count
// from 0 again: the view starts over. The offsets cannot tell: the new log may already be longer than the
// offset the page reached in the old one (it then carried on from there, and skipped the new log's start).
export function supervisorSeen(pid) {
  const before = state.supervisorPid;
  state.supervisorPid = pid;
  if (before !== null && pid !== before) restarted($("#log-lines"));
}

// The view starts over with a line that says why (and its count), and the next fetch reads the new log
// from its start; a fetch still under way (from the old supervisor) is dropped (the epoch).
function restarted(pre) {
  pre.replaceChildren(logLine("supervisor", "info", RESTARTED));
  state.logOffset = null;
  state.logLevels = {};
  state.logEpoch += 1;
  showCount(pre);
}

function logLine(stream, level, text) {
  const span = document.createElement("span");
  span.className = `${stream} level-${level}`;
  span.textContent = text + "\n";
  span.entry = { level, line: text };
  span.classList.toggle("hidden", !logVisible(span.entry));
  return span;
}
