import { ago, api, el, fail, live, nav, when } from "/static/app.js";

nav();
const WINDOWS = { "15m": 15 * 60e3, "6h": 6 * 3600e3, "7d": 7 * 86400e3 };
const CHARTS_BY_DEFAULT = 4;
const asked = new URLSearchParams(location.search);
const view = {
  key: asked.get("key"),
  window: WINDOWS[asked.get("window")] ? asked.get("window") : "15m",
  chosen: asked.getAll("field"),
  fields: [],  // [{name, unit, value}] of the shown key
};
let keys = [], lastReload = 0, reloadTimer = null;

const BYTES = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];

function shown(value, unit) {
  if (typeof value !== "number") return "—";
  if (unit === "percent") return `${+value.toFixed(1)}%`;
  if (unit === "bytes") {
    let scaled = value, power = 0;
    while (Math.abs(scaled) >= 1024 && power < BYTES.length - 1) { scaled /= 1024; power++; }
    return `${+scaled.toFixed(1)} ${BYTES[power]}`;
  }
  if (unit === "ms" || unit === "s") return `${+value.toFixed(2)} ${unit}`;
  return `${+value.toFixed(3)}`;
}

function remember() {
  const query = new URLSearchParams({ key: view.key ?? "", window: view.window });
  for (const name of view.chosen) query.append("field", name);
  history.replaceState(null, "", `/vitals?${query}`);
}

function chartUrl(name) {
  const query = new URLSearchParams({ key: view.key, field: name, window: view.window, t: Date.now() });
  return `/api/vitals/chart.svg?${query}`;
}

function renderLatest(entry) {
  const line = document.getElementById("latest");
  const sample = entry && entry.latest;
  if (!sample) { line.replaceChildren("no sample yet"); return; }
  line.dataset.ts = sample.ts;
  const stamp = `latest sample ${when(sample.ts)} (${ago(sample.ts)})`;
  if (!sample.ok) {
    line.replaceChildren(stamp, ": ", el("span", { class: "state state-error" }, "failed"), ` ${sample.error}`);
    return;
  }
  const values = entry.fields.map((f) => `${f.name} ${shown(f.value, f.unit)}`);
  line.replaceChildren(`${stamp}: ${values.join(" · ") || "no numbers"}`);
}

function renderFields() {
  const names = view.fields.map((f) => f.name);
  const kept = view.chosen.filter((name) => names.includes(name));
  view.chosen = kept.length ? kept : names.slice(0, CHARTS_BY_DEFAULT);
  const toggle = (name) => (event) => {
    view.chosen = names.filter((n) => n === name ? event.target.checked : view.chosen.includes(n));
    renderCharts();
  };
  document.getElementById("fields").replaceChildren(...(view.fields.length ? view.fields.map((f) =>
    el("label", {}, el("input", { type: "checkbox", name: "field", value: f.name,
      checked: view.chosen.includes(f.name), onchange: toggle(f.name) }), ` ${f.name}`))
    : [el("span", { class: "muted" }, "no numeric fields in this window")]));
}

function renderCharts() {
  for (const button of document.querySelectorAll("#windows button")) {
    button.setAttribute("aria-pressed", String(button.dataset.window === view.window));
  }
  document.getElementById("charts").replaceChildren(...view.chosen.map((name) =>
    el("figure", {}, el("img", { class: "chart", id: `chart-${name}`, "data-field": name,
      alt: `${view.key} ${name} chart`, src: chartUrl(name) }))));
  lastReload = Date.now();
  remember();
}

// Fresh charts, each swapped in once loaded (no blank frame while it renders).
function reloadCharts() {
  reloadTimer = null;
  lastReload = Date.now();
  for (const img of document.querySelectorAll("#charts img.chart")) {
    const next = el("img", { class: "chart", id: img.id, "data-field": img.dataset.field, alt: img.alt });
    next.addEventListener("load", () => img.replaceWith(next), { once: true });
    next.src = chartUrl(img.dataset.field);
  }
}

// At most one reload per bucket of the window (3 s to 1 min): a point cannot move sooner.
function scheduleReload() {
  const every = Math.min(Math.max(WINDOWS[view.window] / 600, 3e3), 60e3);
  if (reloadTimer !== null) return;
  reloadTimer = setTimeout(reloadCharts, Math.max(0, lastReload + every - Date.now()));
}

async function loadKeys() {
  keys = (await api("/api/vitals/keys")).keys;
  return keys.find((k) => k.key === view.key);
}

async function showKey() {
  const entry = await loadKeys();
  view.fields = entry ? entry.fields : [];
  if (entry && !view.fields.length) {  // the latest sample failed: the window's fields
    const query = new URLSearchParams({ key: view.key, window: view.window });
    const series = await api(`/api/vitals?${query}`);
    view.fields = Object.entries(series.fields).map(([name, s]) => ({ name, unit: s.unit, value: null }));
  }
  renderLatest(entry);
  renderFields();
  renderCharts();
}

async function refreshLatest() {
  const entry = await loadKeys();
  if (!entry) return;
  const before = view.fields.map((f) => f.name).join("\n");
  if (entry.fields.length) view.fields = entry.fields;
  renderLatest(entry);
  if (view.fields.map((f) => f.name).join("\n") !== before) renderFields();
  scheduleReload();
}

async function start() {
  await loadKeys();
  if (!keys.some((k) => k.key === view.key)) view.key = keys.length ? keys[0].key : null;
  const select = document.getElementById("key");
  select.replaceChildren(...keys.map((k) => el("option", { value: k.key, selected: k.key === view.key },
    k.watcher ? k.key : `${k.key} (no watcher)`)));
  select.addEventListener("change", () => { view.key = select.value; view.chosen = []; showKey().catch(fail); });
  for (const button of document.querySelectorAll("#windows button")) {
    button.addEventListener("click", () => { view.window = button.dataset.window; renderCharts(); });
  }
  if (view.key === null) {
    document.getElementById("latest").replaceChildren("no vitals yet: no watcher has taken a sample");
    return;
  }
  await showKey();
  live("/stream/vitals", { sample: (s) => { if (s.key === view.key) refreshLatest().catch(fail); } });
}

start().catch(fail);
addEventListener("error", fail);
