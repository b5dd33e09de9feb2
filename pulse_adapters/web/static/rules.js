import { ago, el, fail, live, nav, post, short, state, table, when } from "/static/app.js";

nav();
let following = null;

const rev = (r) => (r ? r.slice(0, 12) : "—");
const TIER_NOTES = {
  survival: "fixed, outermost", "built-in": "the engine's own", layer: "layer",
  business: "the engine directory's business rules", unknown: "no tick yet: tiers unknown",
};

function say(text) {
  const box = document.getElementById("notice");
  box.textContent = text;
  box.hidden = false;
}

function decision(r) {
  if (r.error) return el("span", { class: "state state-error" }, "error");
  if (!r.reached) return el("span", { class: "state state-unknown" }, "not reached");
  if (r.effects.length) return el("span", { class: "state state-pending" }, "emitted");
  return el("span", { class: "state state-ok" }, "passed");
}

function tier(t) {
  const title = t.kind === "business" ? `${t.tier} at revision ${rev(t.revision)}` : t.tier;
  return el("section", { class: "tier", "data-tier": t.tier },
    el("h3", {}, title, " ", el("span", { class: "muted" }, `(${TIER_NOTES[t.kind] || t.kind})`)),
    table([
      ["rule", (r) => r.rule], ["decision", decision],
      ["effects", (r) => r.effects.join(", ") || "—"],
      ["interval", (r) => (r.tick_ms === null ? "—" : `${r.tick_ms} ms`)],
      ["error", (r) => short(r.error || "", 200)],
    ], t.rules, { key: (r) => r.rule, empty: "no rules" }));
}

async function rollBack(revision, label) {
  const reason = prompt(`Roll back the engine directory to ${label}?\n\nmain gets a new commit ` +
    "with that revision's files and the daemon reloads with it. Why? (Cancel: no rollback)",
    "rollback from the UI");
  if (reason === null) return;
  say(`Rolling back to ${label}…`);
  let done;
  try {
    done = await post("/api/rollback", { revision, reason });
  } catch (error) {
    if (error instanceof TypeError) {  // the answer was lost: the daemon reloaded meanwhile
      say("The UI restarted before it answered (a rollback reloads the daemon): the " +
          "history below shows the outcome.");
      return;
    }
    say("No rollback was made.");
    throw error;
  }
  if (!done.finished) {
    say(`Rollback ${done.id} is ${done.status}: its outcome appears below.`);
  } else if (done.rollback) {
    const r = done.rollback;
    say(`Rolled back: main is at ${rev(r.revision)} with the files of ${rev(r.to)}; the ` +
        `rolled-back code is kept on branch ${r.kept}. The daemon reloads.`);
  } else {
    say(`Nothing to roll back: main already has the files of ${label} (it stays at ` +
        `${rev(done.result && done.result.revision)}).`);
  }
}

function button(text, revision, label, enabled) {
  return el("button", {
    class: "danger", disabled: !enabled,
    onclick: (e) => { e.stopPropagation(); rollBack(revision, label).catch(fail); },
  }, text);
}

function backtest(b) {
  if (!b) return "";
  const first = b.first.length ? ` (first: tick ${b.first.join(", ")})` : "";
  return `; backtest over ${b.ticks} recorded tick(s): ${b.differs} effect(s) differ in ` +
    `${b.differing} tick(s)${first}`;
}

function what(h) {
  if (h.kind === "promote") return `from ${rev(h.previous)}${backtest(h.backtest)}`;
  return h.to && h.to !== h.revision ? `files of ${rev(h.to)}` : "main stays";
}

function render(data) {
  const t = data.tick;
  document.getElementById("cards").replaceChildren(
    ...[["tick", t.number, "card-tick"], ["last tick", ago(t.at, t.now), "card-last"],
        ["interval", `${t.tick_ms} ms`, "card-interval"],
        ["revision", rev(data.revision), "card-revision"]].map(([label, value, id]) =>
      el("div", { class: "card", id }, el("div", { class: "value" }, value),
        el("div", { class: "label" }, label))));
  document.getElementById("tiers").replaceChildren(...data.tiers.map(tier));
  const good = data.last_good;
  const goodLabel = good.revision ? `${rev(good.revision)} (${good.why})` : good.why;
  const why = !data.has_directory
    ? "this engine runs without an engine directory: nothing to roll back"
    : good.possible ? goodLabel : good.why_not;
  document.getElementById("last-good").replaceChildren(el("p", {},
    button("Roll back to the last known good revision", null, goodLabel,
      data.has_directory && good.possible),
    " ", el("span", { class: "muted", id: "last-good-why" }, why)));
  document.getElementById("history").replaceChildren(table([
    ["when", (h) => when(h.when)], ["event", (h) => state(h.kind)],
    ["revision", (h) => rev(h.revision)], ["what", what],
    ["reason", (h) => short(h.reason || "", 200)],
    ["who", (h) => (h.asked_by ? `${h.asked_by} (via ${h.who})` : h.who)],
    ["kept on", (h) => h.kept || "—"],
    ["", (h) => (h.revision === data.revision ? el("span", { class: "muted" }, "running")
      : h.revision ? button("Roll back to this", h.revision, rev(h.revision), data.has_directory)
        : "")],
  ], data.history, { key: (h) => h.seq, empty: "no promote or rollback on record" }));
  document.getElementById("requests").replaceChildren(table([
    ["asked", (r) => when(r.created_at)], ["effect", (r) => r.id], ["state", (r) => state(r.status)],
    ["by", (r) => r.origin], ["to", (r) => (r.revision ? rev(r.revision) : "last known good")],
    ["reason", (r) => short(r.reason || "", 160)],
    ["outcome", (r) => short(r.error || (r.result ? `main at ${rev(r.result.revision)}` : ""), 200)],
  ], data.requests, { key: (r) => r.id, empty: "no rollback asked for" }));
  if (!following) follow(data.stream);
}

function follow(stream) {
  const params = new URLSearchParams(stream.kinds.map((k) => ["kind", k]));
  params.set("key", stream.key);
  following = live(`/stream/events?${params}`, {
    event: (e) => say(`${e.kind} #${e.seq} recorded: main at ${rev(e.data.revision)}` +
      (e.data.reason ? ` — ${e.data.reason}` : "")),
  });
}

live("/stream/rules", { rules: render });
addEventListener("error", fail);
