import { api, causeList, el, fail, historyHref, nav, pretty, short, when } from "/static/app.js";

nav();
const params = new URLSearchParams(location.search);
const key = params.get("key") || "";
const at = params.get("seq");

function row(event) {
  const here = at !== null && String(event.seq) === at;
  const data = el("details", {}, el("summary", {}, short(event.data, 90)), pretty(event.data));
  return el("tr", { "data-seq": event.seq, id: `seq-${event.seq}`, class: here ? "here" : null },
    el("td", {}, event.seq), el("td", {}, when(event.ts)), el("td", {}, event.kind),
    el("td", {}, event.origin), el("td", {}, data), el("td", {}, causeList(event)));
}

async function load() {
  document.getElementById("key").textContent = key;
  const found = await api(`/api/history?${params}`);
  const head = el("tr", {}, ["seq", "when", "kind", "origin", "data", "why"].map((t) => el("th", {}, t)));
  const rows = found.events.length ? found.events.map(row)
    : [el("tr", {}, el("td", { colspan: 6, class: "muted" }, "no events of this key"))];
  document.getElementById("history").replaceChildren(
    el("table", {}, el("thead", {}, head), el("tbody", {}, rows)));
  const first = found.events[0], last = found.events.at(-1);
  const earlier = document.getElementById("earlier"), later = document.getElementById("later");
  earlier.hidden = !found.earlier;
  if (found.earlier) earlier.replaceChildren("Earlier events: ", el("a", { href: historyHref(key, first.seq - 1) }, "before these"));
  later.hidden = !found.later;
  if (found.later) later.replaceChildren("Later events: ", el("a", { href: historyHref(key) }, "the newest"));
  const target = at === null ? null : document.getElementById(`seq-${at}`);
  if (target) target.scrollIntoView({ block: "center" });
  else if (last) document.getElementById(`seq-${last.seq}`).scrollIntoView({ block: "end" });
}

load().catch(fail);
