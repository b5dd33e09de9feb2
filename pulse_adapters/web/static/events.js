import { api, el, fail, live, nav, pretty, short, when } from "/static/app.js";

nav();
const form = document.getElementById("filters");
const olderButton = document.getElementById("older");
let source = null, older = null, shown = new Set();

function query(extra = {}) {
  const params = new URLSearchParams();
  const data = new FormData(form);
  for (const kind of String(data.get("kind") || "").split(",").map((k) => k.trim())) {
    if (kind) params.append("kind", kind);
  }
  for (const name of ["key", "origin", "since"]) {
    const value = String(data.get(name) || "").trim();
    if (value) params.set(name, value);
  }
  for (const [name, value] of Object.entries(extra)) params.set(name, value);
  return params;
}

async function expand(row, event) {
  const next = row.nextElementSibling;
  if (next && next.classList.contains("detail")) { next.remove(); return; }
  const detail = await api(`/api/events/${event.seq}`);
  const parts = [el("h3", {}, "data"), pretty(detail.data)];
  if (detail.causes.length) {
    parts.push(el("h3", {}, "cause chain"), el("ol", {}, detail.causes.map((c) => el("li", {},
      c.missing ? `#${c.seq} (not readable)` : `#${c.seq} ${c.kind} ${c.key} — ${short(c.data, 140)}`))));
  }
  if (detail.attachment_info) {
    const a = detail.attachment_info;
    parts.push(el("h3", {}, "attachment"), a.stored
      ? el("div", {}, `${a.digest} · ${a.size} bytes`, el("pre", { class: "json" }, a.preview))
      : el("div", { class: "muted" }, `${a.digest}: ${a.reason}`));
  }
  row.after(el("tr", { class: "detail" }, el("td", { colspan: 5 }, parts)));
}

function row(event) {
  const tr = el("tr", { class: "clickable", "data-seq": event.seq },
    el("td", {}, event.seq), el("td", {}, when(event.ts)), el("td", {}, event.kind),
    el("td", {}, event.key), el("td", {}, event.origin), el("td", {}, short(event.data, 110)));
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

async function load() {
  if (source) source.close();
  shown = new Set();
  document.getElementById("events").replaceChildren();
  const page = await api(`/api/events?${query()}`);
  const tbody = body();
  for (const event of page.events) { shown.add(event.seq); tbody.append(row(event)); }
  older = page.older;
  olderButton.hidden = older === null;
  const params = query({ after: page.head });
  source = live(`/stream/events?${params}`, {
    event: (event) => {
      if (shown.has(event.seq)) return;
      shown.add(event.seq);
      body().prepend(row(event));
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
});
form.addEventListener("submit", (e) => { e.preventDefault(); load().catch(fail); });
load().catch(fail);
