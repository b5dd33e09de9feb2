// pulse UI: what every page shares. No framework, no network but this server.

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === null || value === undefined || value === false) continue;
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else node.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

// The nav, from the server's one list of pages (the UI's own, then the layers'); what kept
// a layer's pages out is said under it. Resolves to that list.
export async function nav() {
  const bar = document.getElementById("nav");
  const dot = el("span", { id: "live", class: "live", title: "live updates" }, "●");
  bar.replaceChildren(el("strong", {}, "pulse"), dot);
  let listed = { pages: [], problems: [] };
  try { listed = await api("/api/pages"); } catch (error) { fail(error); return listed; }
  const here = location.pathname;
  const links = listed.pages.map(({ path, title, layer }) => el("a", {
    href: path, class: path === here ? "here" : null, "data-layer": layer }, title));
  bar.replaceChildren(el("strong", {}, "pulse"), ...links, dot);
  if (listed.problems.length) {
    bar.after(el("ul", { id: "page-problems", class: "notice" },
      listed.problems.map((text) => el("li", {}, text))));
  }
  return listed;
}

export async function api(path, options = {}) {
  const response = await fetch(path, { credentials: "same-origin", ...options });
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch { body = { error: text }; }
  if (!response.ok) throw new Error((body && body.error) || `${response.status} ${text}`);
  return body;
}

export function post(path, data) {
  return api(path, { method: "POST", headers: { "content-type": "application/json" },
                     body: JSON.stringify(data) });
}

// A live stream: calls on[eventName](data, id) for each message; shows liveness in the nav.
export function live(path, on) {
  const source = new EventSource(path, { withCredentials: true });
  const dot = () => document.getElementById("live");
  source.onopen = () => { const d = dot(); if (d) d.className = "live on"; };
  source.onerror = () => { const d = dot(); if (d) d.className = "live off"; };
  for (const [name, handle] of Object.entries(on)) {
    source.addEventListener(name, (m) => handle(JSON.parse(m.data), m.lastEventId));
  }
  return source;
}

export function when(ms) {
  if (ms === null || ms === undefined) return "—";
  return new Date(ms).toLocaleString(undefined, { hour12: false });
}

export function ago(ms, now = Date.now()) {
  if (ms === null || ms === undefined) return "—";
  const s = Math.round((now - ms) / 1000);
  if (Math.abs(s) < 60) return `${s} s ago`;
  if (Math.abs(s) < 3600) return `${Math.round(s / 60)} min ago`;
  if (Math.abs(s) < 86400) return `${(s / 3600).toFixed(1)} h ago`;
  return `${(s / 86400).toFixed(1)} d ago`;
}

export function duration(seconds) {
  if (seconds === null || seconds === undefined) return "—";
  const s = Math.round(seconds);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${s % 60}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${Math.floor((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor((s % 86400) / 3600)}h`;
}

export function short(value, max = 120) {
  const text = typeof value === "string" ? value : JSON.stringify(value);
  if (text === undefined) return "";
  return text.length > max ? text.slice(0, max - 1) + "…" : text;
}

// A table: columns are [title, row => cell]; rows may carry a data-key.
export function table(columns, rows, { key = null, onclick = null, empty = "none" } = {}) {
  const head = el("tr", {}, columns.map(([title]) => el("th", {}, title)));
  const body = rows.length ? rows.map((row) => el("tr", {
    "data-key": key ? key(row) : null, class: onclick ? "clickable" : null,
    onclick: onclick ? () => onclick(row) : null,
  }, columns.map(([, cell]) => el("td", {}, cell(row))))) :
    [el("tr", {}, el("td", { colspan: columns.length, class: "muted" }, empty))];
  return el("table", {}, el("thead", {}, head), el("tbody", {}, body));
}

export function state(name) {
  return el("span", { class: `state state-${String(name).toLowerCase()}` }, String(name));
}

export function fail(error) {
  const box = document.getElementById("problem");
  if (box) { box.textContent = String(error.message || error); box.hidden = false; }
}

export function pretty(data) {
  return el("pre", { class: "json" }, JSON.stringify(data, null, 2));
}

// The address of the history of `key` (centred on event `seq` when given).
export function historyHref(key, seq = null) {
  const params = new URLSearchParams({ key });
  if (seq !== null && seq !== undefined) params.set("seq", seq);
  return `/history?${params}`;
}

// A link to the history of `key` (at event `seq`) that a clickable row does not also take.
export function historyLink(key, seq = null, text = key) {
  return el("a", { href: historyHref(key, seq), class: "history",
                   onclick: (e) => e.stopPropagation() }, text);
}

// Why an event is in the log, as /api/events/SEQ and /api/history give it: its cause chain,
// nearest first, then the tick that decided it, each a link to that event in its key's history.
export function causeList(detail) {
  const items = detail.causes.map((c) => el("li", { class: "cause" },
    c.missing ? `#${c.seq} (not readable)` : [
      "caused by ", historyLink(c.key, c.seq, `#${c.seq} ${c.kind} ${c.key}`),
      ` — ${short(c.data, 100)}`]));
  if (detail.tick) {
    const t = detail.tick;
    items.push(el("li", { class: "tick" }, "decided by ",
      historyLink(t.key, t.seq, `tick ${t.data && t.data.number} (#${t.seq})`)));
  }
  return items.length ? el("ul", { class: "causes" }, items) : el("span", { class: "muted" }, "—");
}
