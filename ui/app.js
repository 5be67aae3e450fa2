// The supervisor's operator page: plain JS, no build step; this module
// wires the page, the others (ES modules, loaded by the browser as they are) do the work.
// Talks to the management API (same origin) and to the gateway's data plane
// (its port, CORS) with the management token kept in localStorage.

import { $, sendable, state, TOKEN_KEY } from "./state.js";
import { connect, connectStored, showLogin } from "./session.js";
import { act } from "./status.js";
import { applyLogFilters, followLogs } from "./logs.js";
import { modelChosen, run, takeFile } from "./try-it.js";

document.addEventListener("DOMContentLoaded", () => {
  $("#token-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    if (state.connecting) return; // a second submit (Enter, a double click) while the first connects
    const token = $("#token-input").value.trim();
    // A token that cannot be sent is refused here (it was kept); a token is kept only once the supervisor has
    // accepted it.
    if (!token) { showLogin("Enter the management token (SERVICE_API_TOKEN)."); return; } // nothing was refused
    if (!sendable(token)) { showLogin("The token was refused: it is printable ASCII, without spaces."); return; }
    state.token = token;
    connect(); // which keeps the token once the supervisor has accepted it
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
  // The file input is hidden: from the keyboard, Enter or Space on the drop zone opens the file chooser.
  drop.addEventListener("keydown", (event) => {
    if (event.target !== drop || (event.key !== "Enter" && event.key !== " ")) return;
    event.preventDefault();
    $("#try-file").click();
  });
  $("#try-run").addEventListener("click", run);
  $("#try-params").addEventListener("keydown", (event) => { // Enter in the params runs, as in a form
    if (event.key !== "Enter" || $("#try-run").disabled) return;
    event.preventDefault();
    run();
  });
  // Another tab of this page forgot the token, or connected with another one: this tab follows, so that
  // "Forget token" ends the session in every tab (the others polled on with the token they held).
  window.addEventListener("storage", (event) => {
    if (event.key !== TOKEN_KEY && event.key !== null) return;
    const token = localStorage.getItem(TOKEN_KEY) || "";
    if (!token && state.token) { state.token = ""; showLogin("The token was forgotten in another tab."); }
    else if (token && token !== state.token) { state.token = token; connectStored(); }
  });
  if (state.token) connectStored(); else showLogin();
});
