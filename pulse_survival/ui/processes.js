// The survival layer's page: each essential process, refreshed at the UI's live beat.
import { api, duration, fail, live, nav, state, table } from "/static/app.js";

nav();

function render(r) {
  document.getElementById("processes").replaceChildren(table([
    ["name", (p) => p.name], ["state", (p) => state(p.state)], ["pid", (p) => p.pid ?? "—"],
    ["uptime", (p) => duration(p.uptime_s)],
    ["restarts (1 h)", (p) => p.restarts_last_hour],
    ["note", (p) => p.given_up_why || ""],
  ], r.processes, { key: (p) => p.name, empty: "no essential processes configured" }));
}

let loading = false;
async function load() {
  if (loading) return;
  loading = true;
  try { render(await api("/api/pages/processes")); } finally { loading = false; }
}

load().catch(fail);
live("/stream/overview", { overview: () => load().catch(fail) });
addEventListener("error", fail);
