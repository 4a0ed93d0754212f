// The team panel of a lead session (docs/teams.md): its teammates — name, role, state, current
// task, last message, tokens — from GetTeam (GET /v1/sessions/{id}/team), kept live by the
// `teammate_status` events of the lead's stream; in the lead's place, a person's message to a
// teammate or the lead, the answer to a teammate's pending plan (approve, or reject with a note)
// and a shutdown request the teammate answers (SendTeamMessage); and stopping teammates' running
// turns at once (StopTeammates).

import { h } from "./dom.js";
import { confirmButton } from "./views/common.js";

const enc = encodeURIComponent;
// While a teammate is unfinished the panel reads the team again this often: a plan submitted or
// a task claimed shows even when no stream of the lead is open in this tab.
const REFRESH_MS = 3000;
// A burst of teammate_status events is read back once, this long after the last of it.
const SETTLE_MS = 250;

export class TeamPanel {
  // element: the panel's <section>; openSession(id): show a teammate's own session.
  constructor(api, element, { openSession }) {
    this.api = api;
    this.el = element;
    this.openSession = openSession;
    this.sessionId = "";
    this.team = null;
    this.generation = 0;
    this.timer = 0;
    this.parts = null; // the panel's elements, built on the first team shown (#build)
  }

  // A session was opened: its team, if it leads one (else the panel stays hidden).
  async open(sessionId) {
    this.generation += 1;
    this.sessionId = sessionId;
    this.team = null;
    this.parts = null;
    clearTimeout(this.timer);
    this.el.hidden = true;
    this.el.replaceChildren();
    if (sessionId) await this.refresh();
  }

  // One `teammate_status` event of `sessionId`'s stream: that row at once, the rest re-read.
  event(sessionId, status) {
    if (sessionId !== this.sessionId || !status || !status.name) return;
    const team = this.team || { teammates: [], tasks: [], requests: [] };
    const mates = team.teammates || [];
    const index = mates.findIndex((m) => m.name === status.name);
    if (index < 0) mates.push(status);
    else mates[index] = { ...mates[index], ...status };
    this.team = { ...team, teammates: mates };
    this.#render();
    this.#soon(SETTLE_MS);
  }

  async refresh() {
    const generation = this.generation;
    clearTimeout(this.timer);
    try {
      const team = await this.api.call("GET", `/v1/sessions/${enc(this.sessionId)}/team`);
      if (generation !== this.generation) return;
      this.team = team;
      this.#render();
    } catch {
      // No team here (a session of a teammate, a gateway without team records): nothing shown.
      if (generation !== this.generation) return;
    }
    if ((this.team?.teammates || []).some((m) => m.state !== "finished")) this.#soon(REFRESH_MS);
  }

  #soon(ms) {
    clearTimeout(this.timer);
    const generation = this.generation;
    this.timer = setTimeout(() => {
      if (generation === this.generation) this.refresh();
    }, ms);
  }

  // Built once per session and then updated in place: a redraw never takes the person's typing,
  // focus or a half-pressed Stop away.
  #render() {
    const mates = (this.team?.teammates || []).slice().sort((a, b) => a.name.localeCompare(b.name));
    this.el.hidden = mates.length === 0;
    if (!mates.length) return;
    if (!this.parts) this.#build();
    const { summary, rows, plans, to, stopAll } = this.parts;
    const pending = (this.team.requests || []).filter((r) => r.type === "plan" && r.state === "pending");
    const open = mates.filter((m) => m.state !== "finished").length;
    summary.textContent = ` · ${mates.length} teammate${mates.length === 1 ? "" : "s"}, ${open} at work` +
      (pending.length ? ` · ${pending.length} plan${pending.length === 1 ? "" : "s"} to answer` : "");
    mates.forEach((mate, index) => {
      if (!this.rows.has(mate.name)) this.rows.set(mate.name, this.#row(mate.name));
      const row = this.rows.get(mate.name);
      this.#fill(row, mate);
      // In name order, moved only when out of place: moving a row blurs its focused button, and
      // a blur disarms a half-pressed Stop (a redraw between the two presses lost the first).
      if (rows.children[index] !== row.tr) rows.insertBefore(row.tr, rows.children[index] || null);
    });
    for (const [id, group] of this.plans) {
      if (!pending.some((p) => p.request_id === id)) {
        group.remove();
        this.plans.delete(id);
      }
    }
    for (const plan of pending) {
      if (!this.plans.has(plan.request_id)) {
        this.plans.set(plan.request_id, this.#plan(plan));
        plans.append(this.plans.get(plan.request_id));
      }
    }
    const names = [...mates.filter((m) => m.state !== "finished").map((m) => m.name), "lead"];
    const have = [...to.options].map((o) => o.value);
    if (names.join("\n") !== have.join("\n")) {
      const chosen = to.value;
      to.replaceChildren(...names.map((name) => h("option", { value: name }, name === "lead" ? "the lead" : name)));
      if (names.includes(chosen)) to.value = chosen;
    }
    stopAll.hidden = open === 0;
  }

  #build() {
    const summary = h("span", { class: "muted small" });
    const rows = h("tbody");
    const plans = h("div", { class: "team-plans" });
    const status = h("p", { id: "team-status", class: "muted small", role: "status" });
    this.say = (text) => { status.textContent = text; };
    const stopAll = confirmButton("Stop all teammates", "Press again to stop every teammate", () => this.#stop(""));
    const form = this.#messageForm();
    this.rows = new Map();
    this.plans = new Map();
    this.parts = { summary, rows, plans, to: form.querySelector("select"), stopAll };
    const body = h("div", { id: "team-body", class: "team-body" });
    const fold = h("button", { type: "button", class: "secondary small", "aria-controls": "team-body", "aria-expanded": "true" }, "Fold");
    fold.addEventListener("click", () => {
      body.hidden = !body.hidden;
      fold.setAttribute("aria-expanded", String(!body.hidden));
      fold.textContent = body.hidden ? "Unfold" : "Fold";
    });
    body.append(
      h("table", { class: "data team-table" },
        h("caption", { class: "visually-hidden" }, "Teammates"),
        h("thead", {}, h("tr", {}, ["Name", "Role", "State", "Current task", "Last message", "Tokens", "Actions"]
          .map((text) => h("th", { scope: "col" }, text)))),
        rows),
      plans, form, h("div", { class: "team-actions" }, stopAll));
    this.el.replaceChildren(h("div", { class: "team-head" }, h("h2", { id: "team-title", class: "team-title" }, "Team", summary), fold),
      body, status);
  }

  #row(name) {
    const cells = { role: h("td"), state: h("td", { class: "team-state" }), task: h("td"), last: h("td", { class: "team-last" }),
      tokens: h("td", { class: "num" }) };
    const open = h("button", { type: "button", class: "link", "aria-label": `Open ${name}'s session` }, name);
    // Asked, the teammate ends once it has answered (the shutdown protocol); stopped, its turn ends now.
    const ask = h("button", { type: "button", class: "secondary", "aria-label": `Ask ${name} to stop`,
      title: "A shutdown request: it answers, and ends when it agrees" }, "Ask to stop");
    ask.addEventListener("click", () => this.#askToStop(name, ask));
    const stop = confirmButton("Stop", `Press again to stop ${name}`, () => this.#stop(name),
      { "aria-label": `Stop ${name}`, title: "Cancels its running turn now" });
    const tr = h("tr", { dataset: { mate: name } }, h("th", { scope: "row" }, open),
      cells.role, cells.state, cells.task, cells.last, cells.tokens, h("td", { class: "team-row-actions" }, ask, " ", stop));
    const row = { tr, cells, stop, ask, session: "" };
    open.addEventListener("click", () => row.session && this.openSession(row.session));
    return row;
  }

  #fill(row, mate) {
    const usage = mate.usage || {};
    const tokens = Number(usage.total_tokens || 0) || Number(usage.input_tokens || 0) + Number(usage.output_tokens || 0);
    row.session = mate.session_id || row.session;
    row.tr.dataset.state = mate.state || "";
    row.cells.role.textContent = mate.role || row.cells.role.textContent;
    row.cells.state.textContent = mate.state || "";
    row.cells.task.textContent = mate.current_task || "—";
    row.cells.last.textContent = mate.last_message || "";
    row.cells.tokens.textContent = tokens.toLocaleString("en");
    row.stop.hidden = row.ask.hidden = mate.state === "finished";
  }

  // A teammate's plan waiting for the lead: a person answers in the lead's place.
  #plan(plan) {
    const id = `team-note-${plan.request_id}`;
    const note = h("input", { id, autocomplete: "off" });
    const buttons = [];
    const answer = (approve) => async () => {
      buttons.forEach((b) => { b.disabled = true; });
      try {
        const reply = await this.api.call("POST", `/v1/sessions/${enc(this.sessionId)}/team/messages`, {
          body: { to: plan.teammate, request_id: plan.request_id, approve, text: note.value.trim() } });
        this.say(`Plan ${reply.request_id} of ${plan.teammate}: ${reply.state}.`);
      } catch (error) {
        this.say(error.message);
        buttons.forEach((b) => { b.disabled = false; });
      }
      await this.refresh();
    };
    buttons.push(h("button", { type: "button", onclick: answer(true) }, `Approve ${plan.teammate}'s plan`),
      h("button", { type: "button", class: "danger", onclick: answer(false) }, `Reject ${plan.teammate}'s plan`));
    return h("div", { class: "team-plan", role: "group", "aria-label": `${plan.teammate}'s plan ${plan.request_id}`, dataset: { request: plan.request_id } },
      h("p", {}, `${plan.teammate} asks the lead to approve a plan (${plan.request_id}); with a rejection, the note says what to change:`),
      h("pre", { class: "plan" }, plan.plan),
      h("div", { class: "team-answer" },
        h("label", { for: id }, `Note to ${plan.teammate}`), note, buttons[0], buttons[1]));
  }

  #messageForm() {
    const to = h("select", { id: "team-to" });
    const text = h("textarea", { id: "team-text", rows: 2 });
    const form = h("form", { class: "team-message" },
      h("label", { for: "team-to" }, "Message to"), to,
      h("label", { for: "team-text", class: "visually-hidden" }, "Message for the teammate"), text,
      h("button", { type: "submit" }, "Send to the team"));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      if (!text.value.trim()) {
        this.say("Write a message first.");
        text.focus();
        return;
      }
      try {
        const reply = await this.api.call("POST", `/v1/sessions/${enc(this.sessionId)}/team/messages`,
          { body: { to: to.value, text: text.value.trim() } });
        text.value = "";
        this.say(`Sent to ${to.value === "lead" ? "the lead" : to.value} (message ${reply.seq} of its inbox).`);
      } catch (error) {
        this.say(error.message);
      }
    });
    return form;
  }

  async #askToStop(name, button) {
    button.disabled = true;
    try {
      const reply = await this.api.call("POST", `/v1/sessions/${enc(this.sessionId)}/team/messages`,
        { body: { to: name, shutdown: true } });
      this.say(`Asked ${name} to stop: request ${reply.request_id} (${reply.state}); its answer goes to the lead's inbox.`);
    } catch (error) {
      this.say(error.message);
    }
    button.disabled = false;
    await this.refresh();
  }

  async #stop(name) {
    try {
      const reply = await this.api.call("POST", `/v1/sessions/${enc(this.sessionId)}/team:stop`, { body: name ? { name } : {} });
      const stopped = reply.stopped || [];
      this.say(stopped.length ? `Stopped: ${stopped.join(", ")}.` : "No teammate's turn was running.");
    } catch (error) {
      this.say(error.message);
    }
    await this.refresh();
  }
}
