import { ago, api, el, fail, historyLink, live, nav, short, state, table, when } from "/static/app.js";

nav();

function loops(engine) {
  if (!engine.loops.length) return el("span", { class: "muted" }, "no heartbeat yet");
  return el("ul", { class: "loops" }, engine.loops.map((l) => el("li", { title: l.last_error || "" },
    `${l.name} `, state((l.state === "exited" ? "done" : l.state).toUpperCase()),
    l.restarts ? ` ${l.restarts} restarts` : "")));
}

function leases(engine, now) {
  if (!engine.leases.length) return el("span", { class: "muted" }, "none");
  return el("ul", { class: "leases" }, engine.leases.map((l) => el("li", {},
    historyLink(l.effect_id, null, `${l.type} ${short(l.effect_id, 16)}`),
    ` attempt ${l.attempt}, lease ${l.expired ? "ended" : "until"} ${ago(l.lease_until, now)}`)));
}

function render(found) {
  const now = found.now;
  document.getElementById("engines").replaceChildren(table([
    ["host", (e) => e.host], ["engine", (e) => historyLink(`engine@${e.owner}`, null, e.owner)],
    ["state", (e) => state(e.state.toUpperCase())], ["pid", (e) => e.pid],
    ["started", (e) => when(e.started_at)], ["last seen", (e) => ago(e.last_seen, now)],
    ["last tick", (e) => e.tick === null ? "—" : `${e.tick} · ${ago(e.last_tick_at, now)}`],
    ["version", (e) => [e.version || "—", e.revision ? ` · ${e.revision.slice(0, 10)}` : ""]],
    ["leases", (e) => leases(e, now)], ["loops", loops],
  ], found.engines, { key: (e) => e.owner, empty: "no engine has recorded itself in this log" }));
}

async function load() { render(await api("/api/fleet")); }

let timer = null;
function soon() { clearTimeout(timer); timer = setTimeout(() => load().catch(fail), 200); }
live("/stream/events?kind=engine-started&kind=engine-heartbeat&kind=engine-stopped" +
     "&kind=effect-executing&kind=effect-acked&kind=effect-failed", { event: soon });
setInterval(() => load().catch(fail), 5000);  // an engine goes stale by writing nothing
load().catch(fail);
