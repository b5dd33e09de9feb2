// A layer's page that brings no files of its own: its JSON view drawn as it comes. An
// object's scalars are cards, a list of objects a table, a nested object a section of its own;
// a number named `ts` or `..._at` is a time (engine clock, ms).
import { api, el, fail, live, nav, pretty, short, table, when } from "/static/app.js";

const slug = location.pathname.replace(/^\/+|\/+$/g, "");
let timer = null;

const scalar = (v) => v === null || typeof v !== "object";
const label = (name) => String(name).replaceAll("_", " ");
const shown = (name, v) =>
  (typeof v === "number" && (name === "ts" || String(name).endsWith("_at")) ? when(v) : v ?? "—");

function card(name, value) {
  return el("div", { class: "card", "data-field": name },
    el("div", { class: "value" }, shown(name, value)), el("div", { class: "label" }, label(name)));
}

function rows(list) {
  const columns = [];
  for (const row of list) for (const name of Object.keys(row)) {
    if (!columns.includes(name)) columns.push(name);
  }
  const key = ["key", "id", "name", "slug"].find((k) => columns.includes(k));
  return table(columns.map((c) => [label(c), (r) => (scalar(r[c]) ? shown(c, r[c]) : short(r[c]))]),
    list, { key: key ? (r) => r[key] : null });
}

function section(data, depth) {
  if (scalar(data)) return el("p", {}, data ?? "—");
  if (Array.isArray(data)) {
    if (!data.length) return el("p", { class: "muted" }, "none");
    if (data.every((r) => r && typeof r === "object" && !Array.isArray(r))) return rows(data);
    return el("ul", {}, data.map((v) => el("li", {}, scalar(v) ? v : short(v))));
  }
  if (depth > 2) return pretty(data);
  const entries = Object.entries(data);
  const cards = entries.filter(([, v]) => scalar(v));
  const parts = entries.filter(([, v]) => !scalar(v));
  const heading = depth ? "h3" : "h2";
  return el("div", {},
    cards.length ? el("section", { class: "cards" }, cards.map(([k, v]) => card(k, v))) : null,
    parts.map(([k, v]) => el("section", { "data-field": k }, el(heading, {}, label(k)),
      section(v, depth + 1))));
}

async function load() {
  document.getElementById("view").replaceChildren(section(await api(`/api/pages/${slug}`), 0));
}
function soon() { clearTimeout(timer); timer = setTimeout(() => load().catch(fail), 300); }

nav().then(({ pages }) => {
  const here = pages.find((p) => p.path === `/${slug}`);
  const title = here ? here.title : slug;
  document.getElementById("title").textContent = title;
  document.title = `pulse · ${title}`;
});
load().then(() => live("/stream/events", { event: soon })).catch(fail);
addEventListener("error", fail);
