import { ago, el, fail, historyLink, live, nav, short, state, table, when } from "/static/app.js";

nav();

// A card; one with `href` is a count that opens the events it is made of.
function card(label, value, id, href = null) {
  return el(href ? "a" : "div", { class: "card", id, href }, el("div", { class: "value" }, value ?? "—"),
    el("div", { class: "label" }, label));
}

function nextTick(engine) {
  if (engine.next_tick_at === null || engine.next_tick_at === undefined) return "—";
  const left = (engine.next_tick_at - engine.now) / 1000;
  return left <= 0 ? "due" : `in ${left.toFixed(1)} s`;
}

function summary(data) {
  if (data === null || typeof data !== "object") return short(data, 80);
  const numbers = Object.entries(data).filter(([, v]) => typeof v === "number");
  return numbers.length ? numbers.slice(0, 4).map(([k, v]) => `${k} ${+v.toFixed(2)}`).join(" · ")
                        : short(data, 80);
}

function render(o) {
  const e = o.engine, fx = o.effects;
  document.getElementById("cards").replaceChildren(
    card("ticks", e.ticks, "card-ticks"),
    card("ticks / min", e.ticks_per_minute, "card-rate"),
    card("last tick", ago(e.last_tick_at, e.now), "card-last"),
    card("next tick", nextTick(e), "card-next"),
    card("revision", e.revision ? e.revision.slice(0, 10) : "none", "card-revision"),
    card("pending", fx.pending + fx.retrying, "card-pending", "/events?effects=pending&effects=retrying"),
    card("executing", fx.executing, "card-executing", "/events?effects=executing"),
    card("failed", fx.failed, "card-failed", "/events?effects=failed"),
    card("events", e.seq, "card-seq", "/events"),
  );
  document.getElementById("loops").replaceChildren(table([
    // a loop whose body returned ended by design (a one-shot check): done, not a failure
    ["loop", (l) => l.name], ["state", (l) => state(l.state === "exited" ? "DONE" : l.state.toUpperCase())],
    ["restarts", (l) => l.restarts], ["since", (l) => ago(l.started_at, e.now)],
    ["last error", (l) => short(l.last_error || "", 160)],
  ], o.loops, { key: (l) => l.name }));
  document.getElementById("survival").replaceChildren(table([
    ["when", (s) => when(s.ts)], ["what", (s) => historyLink(s.key, s.seq, `${s.kind} ${s.type}`)],
    ["detail", (s) => short(s.body, 160)],
  ], o.survival, { key: (s) => s.seq, empty: "nothing fired" }));
  document.getElementById("watchers").replaceChildren(table([
    ["key", (w) => el("a", { href: `/vitals?key=${encodeURIComponent(w.key)}` }, w.key)],
    ["latest", (w) => w.ok === false ? el("span", { class: "state state-error" }, w.error)
                                      : summary(w.data)],
    ["taken", (w) => ago(w.ts, e.now)],
    ["last 15 min", (w) => el("img", { class: "spark", alt: `${w.key} sparkline`,
      src: `/api/vitals/spark.svg?key=${encodeURIComponent(w.key)}&t=${w.ts}` })],
  ], o.watchers, { key: (w) => w.key, empty: "no watchers" }));
}

live("/stream/overview", { overview: render });
addEventListener("error", fail);
