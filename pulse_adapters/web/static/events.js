import { api, causeList, el, fail, historyLink, live, nav, pretty, short, when } from "/static/app.js";

nav();
const form = document.getElementById("filters");
const olderButton = document.getElementById("older");
const selection = document.getElementById("selection");
let source = null, older = null, shown = new Set();
// effects=STATE (repeatable) selects, for each effect in one of those states, the event that
// put it there: what a count of effects is made of (the Overview's and Effects page's cards).
let effects = [];

function fromAddress() {
  const params = new URLSearchParams(location.search);
  form.elements.kind.value = params.getAll("kind").join(",");
  for (const name of ["key", "origin", "since"]) form.elements[name].value = params.get(name) || "";
  effects = params.getAll("effects");
  selection.hidden = !effects.length;
  selection.replaceChildren(effects.length ? [
    `Effects ${effects.join(" or ")}: for each, the event that put it there. `,
    el("a", { href: "/events" }, "every event")] : []);
}

function query(extra = {}) {
  const params = new URLSearchParams();
  if (effects.length) {
    for (const state of effects) params.append("effects", state);
  } else {
    const data = new FormData(form);
    for (const kind of String(data.get("kind") || "").split(",").map((k) => k.trim())) {
      if (kind) params.append("kind", kind);
    }
    for (const name of ["key", "origin", "since"]) {
      const value = String(data.get(name) || "").trim();
      if (value) params.set(name, value);
    }
  }
  for (const [name, value] of Object.entries(extra)) params.set(name, value);
  return params;
}

async function expand(row, event) {
  const next = row.nextElementSibling;
  if (next && next.classList.contains("detail")) { next.remove(); return; }
  const detail = await api(`/api/events/${event.seq}`);
  const parts = [el("h3", {}, "data"), pretty(detail.data)];
  if (detail.causes.length || detail.tick) parts.push(el("h3", {}, "why"), causeList(detail));
  parts.push(el("p", {}, historyLink(event.key, event.seq, `the history of ${event.key}`)));
  if (detail.attachment_info) {
    const a = detail.attachment_info;
    parts.push(el("h3", {}, "attachment"), a.stored
      ? el("div", {}, `${a.digest} · ${a.size} bytes`, el("pre", { class: "json" }, a.preview))
      : el("div", { class: "muted" }, `${a.digest}: ${a.reason}`));
  }
  row.after(el("tr", { class: "detail" }, el("td", { colspan: 6 }, parts)));
}

function row(event) {
  const tr = el("tr", { class: "clickable", "data-seq": event.seq },
    el("td", {}, event.seq), el("td", {}, when(event.ts)), el("td", {}, event.kind),
    el("td", {}, historyLink(event.key, event.seq)), el("td", {}, event.origin),
    el("td", {}, short(event.data, 110)));
  tr.addEventListener("click", () => expand(tr, event).catch(fail));
  return tr;
}

function body() {
  let tbody = document.querySelector("#events tbody");
  if (!tbody) {
    const head = el("tr", {}, ["seq", "when", "kind", "key", "origin", "data"].map((t) => el("th", {}, t)));
    document.getElementById("events").replaceChildren(
      el("table", {}, el("thead", {}, head), tbody = el("tbody")));
  }
  return tbody;
}

function counted() {
  const n = shown.size;
  document.getElementById("count").textContent =
    `${n} event${n === 1 ? "" : "s"} shown${older === null ? "" : " (older ones below)"}`;
}

async function load() {
  if (source) source.close();
  shown = new Set();
  document.getElementById("events").replaceChildren();
  const page = await api(`/api/events?${query()}`);
  const tbody = body();
  for (const event of page.events) { shown.add(event.seq); tbody.append(row(event)); }
  older = page.older;
  olderButton.hidden = older === null;
  counted();
  if (effects.length) return;  // a selection by state: the state's count moves on its own page
  const params = query({ after: page.head });
  source = live(`/stream/events?${params}`, {
    event: (event) => {
      if (shown.has(event.seq)) return;
      shown.add(event.seq);
      body().prepend(row(event));
      counted();
    },
  });
}

olderButton.addEventListener("click", async () => {
  const page = await api(`/api/events?${query({ before: older })}`).catch(fail);
  if (!page) return;
  for (const event of page.events) {
    if (!shown.has(event.seq)) { shown.add(event.seq); body().append(row(event)); }
  }
  older = page.older;
  olderButton.hidden = older === null;
  counted();
});
form.addEventListener("submit", (e) => {
  e.preventDefault();
  effects = [];
  selection.hidden = true;
  history.replaceState(null, "", `/events?${query()}`);
  load().catch(fail);
});
fromAddress();
load().catch(fail);
