import { ago, api, el, fail, historyLink, live, nav, post, pretty, short, state, table, when } from "/static/app.js";

nav();
const form = document.getElementById("filters");
let timer = null;

async function act(effect, action) {
  const reason = prompt(`${action} effect ${effect.id} (${effect.type}) — why?`, `${action} from the UI`);
  if (reason === null) return;
  await post(`/api/effects/${encodeURIComponent(effect.id)}/${action}`, { reason });
  await load();
}

function controls(effect) {
  const buttons = [];
  if (effect.status === "pending" || effect.status === "retrying") {
    buttons.push(el("button", { class: "cancel", onclick: (e) => { e.stopPropagation(); act(effect, "cancel").catch(fail); } }, "Cancel"));
  }
  if (effect.status === "failed" || effect.status === "cancelled") {
    buttons.push(el("button", { class: "retry", onclick: (e) => { e.stopPropagation(); act(effect, "retry").catch(fail); } }, "Retry"));
  }
  return buttons;
}

async function load() {
  const status = new FormData(form).get("status") || "";
  const [found, tasks] = await Promise.all([
    api(`/api/effects${status ? `?status=${status}` : ""}`), api("/api/tasks")]);
  // each count opens the events it is made of: an acked effect is its one effect-acked event,
  // any other the event that put it in its state
  document.getElementById("counts").replaceChildren(...Object.entries(found.counts).map(([name, n]) =>
    el("a", { class: "card", id: `count-${name}`,
              href: name === "acked" ? "/events?kind=effect-acked" : `/events?effects=${name}` },
      el("div", { class: "value" }, n), el("div", { class: "label" }, name))));
  document.getElementById("effects").replaceChildren(table([
    ["id", (f) => historyLink(f.id)], ["type", (f) => f.type], ["state", (f) => state(f.status)],
    ["attempts", (f) => f.attempt], ["lease holder", (f) => f.owner || "—"],
    ["created", (f) => ago(f.created_at)],
    ["took", (f) => f.duration_ms === null ? "—" : `${(f.duration_ms / 1000).toFixed(2)} s`],
    ["error", (f) => (f.error ? short(f.error, 140) : f.earlier_error
      ? el("span", { class: "muted" }, `earlier attempt: ${short(f.earlier_error, 120)}`) : "")],
    ["", controls],
  ], found.effects, {
    key: (f) => f.id, empty: "no effects",
    onclick: (f) => { const box = document.getElementById(`fx-${f.id}`);
      if (box) box.remove(); else document.querySelector(`tr[data-key="${CSS.escape(f.id)}"]`)
        .after(el("tr", { id: `fx-${f.id}` }, el("td", { colspan: 9 }, pretty(f)))); },
  }));
  document.getElementById("tasks").replaceChildren(table([
    ["id", (t) => historyLink(t.id)], ["title", (t) => t.title], ["state", (t) => state(t.status)],
    ["agent", (t) => t.agent || "—"], ["priority", (t) => t.priority],
    ["created", (t) => when(t.createdAt)], ["result / reason", (t) => short(t.result ?? t.reason ?? "", 120)],
  ], tasks.tasks, { key: (t) => t.id, empty: "no tasks" }));
}

function soon() { clearTimeout(timer); timer = setTimeout(() => load().catch(fail), 200); }
form.addEventListener("change", soon);
live("/stream/events?kind=effect&kind=effect-executing&kind=effect-acked&kind=effect-failed" +
     "&kind=effect-cancelled&kind=effect-retried&kind=task-created&kind=task-assigned" +
     "&kind=task-executing&kind=task-acked&kind=task-closed&kind=task-given-up", { event: soon });
load().catch(fail);
