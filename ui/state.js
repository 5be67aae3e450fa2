// What every module of the page shares: the management token's key in localStorage, the page's
// state, and the one DOM helper.

export const TOKEN_KEY = "inference-service.token";
export const $ = (sel) => document.querySelector(sel);
// Whether a token can be sent: a header carries printable ASCII only, and fetch throws on anything else, which
// read as an unreachable supervisor.
export const sendable = (token) => /^[\x21-\x7e]+$/.test(token);

export const state = { token: localStorage.getItem(TOKEN_KEY) || "", status: null, catalog: [], busy: new Set(),
                logServer: null, logOffset: null, logLines: [], logEpoch: 0, // see restarted() in logs.js
                supervisorPid: null, // the supervisor's pid in the last status: a new one restarted
                image: null, imageB64: null,
                refreshTimer: null, logTimer: null, seriesTimer: null, series: null, defaults: {}, versions: {}, modes: {},
                connecting: false, session: 0, // connect() running; the login session (see stopPolling)
                loadingDefaults: false, // a model's OpenAPI document asked for, for its params' defaults
                processKeys: {}, // by model: its processes in the last status (see forgetChangedDefaults)
                offlineSince: null, // when the first of the status refreshes that fail in a row failed
                retryTimer: null, // the next connect while the supervisor cannot be reached
                run: 0 }; // the number of the last run of "Try it" (a new model's form drops older ones)
