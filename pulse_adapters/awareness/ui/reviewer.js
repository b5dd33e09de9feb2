import { ago, api, el, fail, live, nav, short, state, table, when } from "/static/app.js";

nav();
let timer = null, following = null;

function card(label, value, id) {
  return el("div", { class: "card", id }, el("div", { class: "value" }, value ?? "—"),
    el("div", { class: "label" }, label));
}

function verbs(cycle) {
  const parts = cycle.accepted.map((v) => `✓ ${v.verb} ${v.target}`)
    .concat(cycle.rejected.map((r) => `✗ ${short(r.proposal, 60)}`));
  return parts.length ? parts.join(" · ") : "—";
}

function render(r) {
  const d = r.degradation;
  document.getElementById("cards").replaceChildren(
    card("mode", d.degraded ? "narration only (degraded)" : "full", "card-mode"),
    card("rejection rate (recent)", d.rejection_rate === null ? "—"
      : `${Math.round(d.rejection_rate * 100)} % of ${d.proposed}`, "card-rate"),
    card("model calls today", r.calls_today, "card-calls"),
    card("identities", r.identities.length, "card-identities"),
  );
  document.getElementById("cycles").replaceChildren(table([
    ["when", (c) => when(c.ts)], ["identity", (c) => c.identity],
    ["outcome", (c) => state(c.outcome)],
    ["asked because", (c) => c.reason + (c.quiet_skips ? ` (after ${c.quiet_skips} quiet skips)` : "")],
    ["calls", (c) => c.model_calls], ["took", (c) => `${c.inference_ms} ms`],
    ["verbs", verbs],
    ["narration / error", (c) => short(c.error || c.narration || "", 200)],
  ], r.cycles, { key: (c) => c.seq, empty: "no review cycle yet" }));
  document.getElementById("verbs").replaceChildren(table([
    ["when", (v) => when(v.ts)], ["identity", (v) => v.identity],
    ["verdict", (v) => state(v.accepted ? "accepted" : "rejected")],
    ["verb", (v) => (v.accepted ? `${v.verb} ${v.target}` : "—")],
    ["change / proposal", (v) => short(v.change, 120)], ["reason", (v) => short(v.reason, 200)],
  ], r.verbs, { empty: "no verb proposed" }));
  document.getElementById("skipped").replaceChildren(table([
    ["when", (s) => when(s.ts)], ["identity", (s) => s.identity ?? "—"],
    ["asked because", (s) => s.asked_because ?? "—"], ["why no cycle", (s) => short(s.why, 200)],
  ], r.skipped, { key: (s) => s.effect, empty: "none" }));
  document.getElementById("identities").replaceChildren(table([
    ["identity", (i) => i.identity], ["last cycle", (i) => ago(i.last_cycle_at, r.now)],
    ["last outcome", (i) => state(i.last_outcome || "none")],
    ["failures in a row", (i) => i.failures_in_a_row],
    ["last success", (i) => ago(i.last_success_at, r.now)], ["calls today", (i) => i.calls_today],
  ], r.identities, { key: (i) => i.identity, empty: "no identity reviewed yet" }));
  const tokens = (n) => (n === null ? "not recorded" : n);
  document.getElementById("days").replaceChildren(table([
    ["day", (t) => t.day], ["cycles", (t) => t.cycles], ["model calls", (t) => t.model_calls],
    ["prompt tokens", (t) => tokens(t.prompt_tokens)],
    ["completion tokens", (t) => tokens(t.completion_tokens)],
    ["inference", (t) => `${(t.inference_ms / 1000).toFixed(1)} s`],
    ["verbs accepted / rejected", (t) => `${t.accepted} / ${t.rejected}`],
    ["outcomes", (t) => Object.entries(t.outcomes).map(([k, n]) => `${k} ${n}`).join(" · ")],
  ], r.days, { key: (t) => t.day, empty: "no review yet" }));
  document.getElementById("journal").replaceChildren(table([
    ["when", (j) => when(j.ts)], ["identity", (j) => j.key.replace(/^identity:/, "")],
    ["narration", (j) => j.narration],
  ], r.journal, { key: (j) => j.seq, empty: "no journal entry yet" }));
  if (!following) {
    const params = new URLSearchParams(r.kinds.map((k) => ["kind", k]));
    following = live(`/stream/events?${params}`, { event: soon });
  }
}

async function load() { render(await api("/api/pages/reviewer")); }
function soon() { clearTimeout(timer); timer = setTimeout(() => load().catch(fail), 200); }

load().catch(fail);
addEventListener("error", fail);
