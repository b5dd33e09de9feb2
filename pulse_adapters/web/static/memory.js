import { api, el, fail, live, nav, short, table, when } from "/static/app.js";

nav();
let chosen = new URLSearchParams(location.search).get("identity");
let timer = null, following = null;

const by = (who, at) => `${who || "—"} · ${when(at)}`;

function pick(identity) {
  chosen = identity;
  history.replaceState(null, "", `?identity=${encodeURIComponent(identity)}`);
  load().catch(fail);
}

function fill(id, columns, rows, empty) {
  document.getElementById(id).replaceChildren(table(columns, rows, { empty }));
}

function records(r) {
  document.getElementById("records").hidden = false;
  document.getElementById("records-title").textContent =
    `${r.identity}${r.name && r.name !== r.identity ? ` (${r.name})` : ""} · version ${r.version}`;
  document.getElementById("counts").replaceChildren(...Object.entries(r.counts).map(([name, n]) =>
    el("div", { class: "card" }, el("div", { class: "value" }, n), el("div", { class: "label" }, name))));
  fill("exchanges", [["when", (x) => when(x.at)], ["role", (x) => x.role], ["text", (x) => x.text],
    ["by", (x) => x.by], ["record", (x) => x.record]], r.exchanges, "no exchange");
  fill("state", [["item", (s) => s.item], ["value", (s) => short(s.value, 160)],
    ["confidence", (s) => s.confidence.toFixed(2)],
    ["protected", (s) => (s.protected ? "yes" : "")], ["set", (s) => by(s.set_by, s.set_at)],
    ["revised", (s) => (s.revised_by ? `${by(s.revised_by, s.revised_at)} — ${s.revision_reason}` : "—")],
  ], r.state, "no state");
  fill("unresolved", [["priority", (u) => u.priority], ["text", (u) => u.text],
    ["opened", (u) => by(u.opened_by, u.opened_at)]], r.unresolved, "nothing unresolved");
  fill("observations", [["when", (o) => when(o.at)], ["source", (o) => o.source], ["key", (o) => o.key],
    ["value", (o) => short(o.value, 120)], ["severity", (o) => o.severity],
    ["routine", (o) => (o.routine ? "yes" : "")], ["by", (o) => o.by]], r.observations, "no observation");
  const notes = [...r.facts.map((f) => ({ ...f, type: "fact" })),
    ...(r.reflection ? [{ ...r.reflection, type: "reflection" }] : [])];
  fill("facts", [["type", (n) => n.type], ["text", (n) => n.text],
    ["valid", (n) => (n.valid_from || n.valid_until ? `${when(n.valid_from)} – ${when(n.valid_until)}` : "—")],
    ["written", (n) => by(n.by, n.at)]], notes, "none");
  fill("removed", [["record", (x) => x.record], ["was", (x) => x.was || "—"], ["how", (x) => x.how],
    ["why", (x) => x.reason], ["by", (x) => by(x.by, x.at)]], r.removed, "nothing removed");
}

async function load() {
  const list = await api("/api/memory");
  document.getElementById("identities").replaceChildren(table([
    ["identity", (i) => i.identity], ["name", (i) => i.name],
    ["records", (i) => Object.entries(i.counts).filter(([, n]) => n).map(([k, n]) => `${k} ${n}`).join(" · ") || "—"],
    ["last exchange", (i) => (i.last_exchange ? `${when(i.last_exchange.ts)} ${i.last_exchange.role}: ${short(i.last_exchange.text, 100)}` : "—")],
  ], list.identities, { key: (i) => i.identity, onclick: (i) => pick(i.identity), empty: "no identity in memory" }));
  if (chosen && list.identities.some((i) => i.identity === chosen)) {
    records(await api(`/api/memory/${encodeURIComponent(chosen)}`));
  }
  if (!following) {
    const params = new URLSearchParams(list.kinds.map((k) => ["kind", k]));
    following = live(`/stream/events?${params}`, { event: soon });
  }
}

function soon() { clearTimeout(timer); timer = setTimeout(() => load().catch(fail), 200); }

load().catch(fail);
addEventListener("error", fail);
