// -- API: the management API (same origin) and the gateway's data plane (its port, CORS), both
// with the management token.

import { state } from "./state.js";
import { tokenRefused } from "./session.js";

export class HttpError extends Error {
  constructor(status, body) { super(body && (body.error || body.status_str) || `HTTP ${status}`); this.status = status; this.body = body; }
}

// A read of the management API that has no reply within this many ms fails (an AbortError), so that a
// supervisor that hangs (stopped with SIGSTOP, a network path that drops packets) counts as a failed refresh
// like one that is gone. Actions (POST) wait as long as they take: a model's restart may take minutes.
export const READ_TIMEOUT_MS = 10000;

// A timed read (`{ poll: true }`: the status, a model's log, the series) says so in X-Service-Poll, and the
// supervisor logs it at debug level: with a tab open it was a line every second or so in its output.
export async function api(path, { poll = false, ...options } = {}) {
  const token = state.token;
  const read = !options.method || options.method === "GET";
  const signal = options.signal || (read ? AbortSignal.timeout(READ_TIMEOUT_MS) : undefined);
  const headers = { Authorization: `Bearer ${token}`, ...(poll ? { "X-Service-Poll": "ui" } : {}), ...(options.headers || {}) };
  const response = await fetch(path, { ...options, signal, headers });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  // Only the token in use is refused: a request sent before "Forget token" (or a new token) says nothing.
  if (response.status === 401) { if (token && token === state.token) tokenRefused(); throw new HttpError(401, body); }
  if (!response.ok) throw new HttpError(response.status, body);
  return body;
}

export function gatewayBase() {
  const port = state.status ? state.status.gateway.port : 8080;
  return `${location.protocol}//${location.hostname}:${port}`;
}

export async function gateway(path, options = {}) {
  const response = await fetch(gatewayBase() + path, {
    ...options,
    headers: { Authorization: `Bearer ${state.token}`, "Content-Type": "application/json", ...(options.headers || {}) },
  });
  let body = null;
  try { body = await response.json(); } catch (e) { body = null; }
  return { status: response.status, body };
}
