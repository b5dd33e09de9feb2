// The survival layer's page: each essential process, refreshed at the UI's live beat, with
// the operator's controls that make sense in its state and the end of its output log.
import { api, duration, el, fail, live, nav, post, state, table } from "/static/app.js";

nav();
let shown = null; // the process whose log is open
let latest = { processes: [], startable: [] };

// What an operator may do in each state (start, restart and reset only with an argv).
const CONTROLS = {
  RUNNING: ["stop", "restart"], STARTING: ["stop", "restart"], BACKOFF: ["start", "stop"],
  FATAL: ["reset", "start"], STOPPED: ["start"],
};
const STOP_ONLY = new Set(["stop"]);

async function act(process, action) {
  const done = await post(`/api/pages/processes/${action}`, { name: process.name });
  document.getElementById("problem").hidden = true;
  document.getElementById("asked").textContent =
    `${action} ${done.name}: asked (event #${done.seq}, it was ${done.was})`;
  await load();
}

function controls(process) {
  if (process.pending) {
    return el("span", { class: "muted" }, `${process.pending} asked by ${process.asked_by}`);
  }
  const startable = latest.startable.includes(process.name);
  const actions = (CONTROLS[process.state] || []).filter((a) => startable || STOP_ONLY.has(a));
  return actions.map((action) => el("button", {
    class: `process-${action}`, "data-action": action,
    onclick: () => act(process, action).catch(fail) }, action[0].toUpperCase() + action.slice(1)));
}

function note(process) {
  if (process.state === "STOPPED") return "stopped by an operator";
  return process.given_up_why || "";
}

function render(r) {
  latest = r;
  document.getElementById("processes").replaceChildren(table([
    ["name", (p) => p.name], ["state", (p) => state(p.state)], ["pid", (p) => p.pid ?? "—"],
    ["uptime", (p) => duration(p.uptime_s)],
    ["restarts (1 h)", (p) => p.restarts_last_hour],
    ["note", note], ["control", controls],
    ["log", (p) => el("button", { class: "process-log", onclick: () => openLog(p.name) }, "Log")],
  ], r.processes, { key: (p) => p.name, empty: "no essential processes configured" }));
}

async function showLog() {
  if (shown === null) return;
  const box = document.getElementById("log");
  box.hidden = false;
  document.getElementById("log-name").textContent = shown;
  const lines = document.getElementById("log-lines");
  try {
    const found = await api(`/api/pages/processes?log=${encodeURIComponent(shown)}&lines=50`);
    document.getElementById("log-path").textContent = found.path;
    lines.textContent = found.lines.join("\n");
  } catch (error) {
    document.getElementById("log-path").textContent = "";
    lines.textContent = String(error.message || error);
  }
}

function openLog(name) {
  shown = name;
  showLog().catch(fail);
}

let loading = false;
async function load() {
  if (loading) return;
  loading = true;
  try {
    render(await api("/api/pages/processes"));
    await showLog();
  } finally { loading = false; }
}

load().catch(fail);
live("/stream/overview", { overview: () => load().catch(fail) });
addEventListener("error", fail);
