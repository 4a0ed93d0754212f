// The dev panel: every event of the chat streams this console read (each turn's SSE: run_started,
// text and reasoning deltas, tool calls and results, approvals, status, task updates, the end),
// and of any recent run loaded by its id (JoinRun replays it: #/dev/RUN_ID), kept in memory for
// this tab and filterable by type and session. A run loaded by its id also shows its model calls'
// requests and responses, when the deployment or the session records them (GET
// /v1/sessions/{id}/model_calls); a switch turns recording on or off for one session
// (Session.record_model_calls, PATCH /v1/sessions/{id}).

import { h } from "./dom.js";
import { streamGet } from "./views/common.js";

const KEEP = 5000;

export class DevPanel {
  // sessions(): the sessions the sidebar lists (the recording switch picks among them).
  constructor(api, { sessions = () => [] } = {}) {
    this.api = api;
    this.sessions = sessions;
    this.seen = new Set(); // run_id:seq of the events held, so a run loaded twice is not doubled
    this.events = [];
    this.hidden = new Set(); // event types filtered out
    this.session = "";
    this.list = null;
    this.run = null; // the loaded run's model calls: { runId, calls, failure }
  }

  // One SSE message of a session's chat stream ({id, event, data}), as read.
  record(sessionId, message) {
    const key = message.data && message.data.run_id && message.data.seq ? `${message.data.run_id}:${message.data.seq}` : "";
    if (key && this.seen.has(key)) return;
    if (key) this.seen.add(key);
    const entry = { at: Date.now(), sessionId, id: message.id, type: message.event, data: message.data };
    this.events.push(entry);
    if (this.events.length > KEEP) this.events.splice(0, this.events.length - KEEP);
    if (this.list && this.#visible(entry)) this.list.append(this.#row(entry));
  }

  hide() {
    this.list = null;
  }

  show(mount, runId = "") {
    if (runId) {
      this.#load(mount, runId);
      return;
    }
    this.run = null;
    this.#render(mount);
  }

  #render(mount) {
    const types = [...new Set(this.events.map((e) => e.type))].sort();
    const sessions = [...new Set(this.events.map((e) => e.sessionId))];
    const status = h("p", { class: "muted view-status", role: "status" });
    this.list = h("ol", { class: "dev-events", "aria-label": "Events" });
    const redraw = () => {
      const shown = this.events.filter((e) => this.#visible(e));
      this.list.replaceChildren(...shown.map((e) => this.#row(e)));
      status.textContent = `${shown.length} of ${this.events.length} events`;
    };
    const session = h("select", { id: "dev-session" }, h("option", { value: "" }, "Every session"),
      sessions.map((id) => h("option", { value: id, selected: id === this.session }, id)));
    session.addEventListener("change", () => {
      this.session = session.value;
      redraw();
    });
    const filters = h("fieldset", { class: "dev-types" }, h("legend", {}, "Event types"),
      types.length ? types.map((type) => {
        const box = h("input", { type: "checkbox", id: `dev-type-${type}`, checked: !this.hidden.has(type), value: type });
        box.addEventListener("change", () => {
          if (box.checked) this.hidden.delete(type);
          else this.hidden.add(type);
          redraw();
        });
        return h("label", { class: "inline", for: `dev-type-${type}` }, box, ` ${type} (${this.events.filter((e) => e.type === type).length})`);
      }) : h("span", { class: "muted" }, "No events yet: chat with the agent and they show here."));
    const clear = h("button", { type: "button", class: "secondary" }, "Clear events");
    clear.addEventListener("click", () => {
      this.events = [];
      this.seen.clear();
      this.#render(mount);
    });
    const run = h("input", { id: "dev-run", autocomplete: "off", spellcheck: "false", placeholder: "run-…" });
    const load = h("form", { class: "view-form" }, h("label", { for: "dev-run" }, "Load a run's events"), run,
      h("button", { type: "submit" }, "Load"));
    load.addEventListener("submit", (event) => {
      event.preventDefault();
      if (run.value.trim()) location.hash = `#/dev/${encodeURIComponent(run.value.trim())}`;
    });
    mount.replaceChildren(
      h("div", { class: "view-head" }, h("h2", { id: "view-title", tabindex: "-1" }, "Dev panel"),
        h("p", { class: "muted" }, "Every event of the chat streams this tab read, newest last.")),
      status,
      h("div", { class: "view-body" },
        h("form", { class: "view-form" }, h("label", { for: "dev-session" }, "Session"), session, clear), load,
        this.#recording(),
        this.run ? this.#calls() : null, filters, this.list));
    mount.setAttribute("aria-labelledby", "view-title");
    redraw();
  }

  // Whether a session's turns record their model calls (UpdateSession's record_model_calls): the
  // switch shows the chosen session's setting and changes it at once.
  #recording() {
    const sessions = this.sessions();
    const chosen = this.recordFor && sessions.some((s) => s.session_id === this.recordFor) ? this.recordFor
      : this.session && sessions.some((s) => s.session_id === this.session) ? this.session : sessions[0]?.session_id || "";
    this.recordFor = chosen;
    const status = h("span", { id: "dev-record-status", class: "muted small", role: "status" });
    const pick = h("select", { id: "dev-record-session" },
      sessions.map((s) => h("option", { value: s.session_id, selected: s.session_id === chosen }, s.title || s.session_id)));
    const box = h("input", { type: "checkbox", id: "dev-record", disabled: !chosen });
    const show = (session) => {
      box.checked = Boolean(session && session.record_model_calls);
      status.textContent = !session ? "" : box.checked
        ? "Its turns record each model call's request and response."
        : "Its turns record no model call (unless the deployment records every session's).";
    };
    show(sessions.find((s) => s.session_id === chosen));
    pick.addEventListener("change", () => {
      this.recordFor = pick.value;
      show(this.sessions().find((s) => s.session_id === pick.value));
    });
    box.addEventListener("change", async () => {
      const sessionId = pick.value;
      try {
        const session = await this.api.call("PATCH", `/v1/sessions/${encodeURIComponent(sessionId)}`,
          { body: { record_model_calls: box.checked, update_mask: ["record_model_calls"] } });
        const listed = this.sessions().find((s) => s.session_id === sessionId);
        if (listed) listed.record_model_calls = session.record_model_calls;
        show(session);
      } catch (error) {
        box.checked = !box.checked;
        status.textContent = error.message;
      }
    });
    return h("fieldset", { class: "view-form dev-record" }, h("legend", {}, "Record model calls"),
      h("label", { for: "dev-record-session" }, "Session to record"), pick,
      h("label", { class: "inline", for: "dev-record" }, box, " Record this session's model calls"), status);
  }

  // A recent run's events from its start (GET /v1/runs/{id}/join), added to the panel; then the
  // panel shows that run's session.
  async #load(mount, runId) {
    mount.replaceChildren(h("div", { class: "view-head" }, h("h2", { id: "view-title", tabindex: "-1" }, "Dev panel")),
      h("p", { class: "muted view-status", role: "status" }, `Loading the events of ${runId}…`));
    let sessionId = "";
    let failure = "";
    try {
      for await (const message of streamGet(this.api, `/v1/runs/${encodeURIComponent(runId)}/join`)) {
        sessionId = message.data.session_id || sessionId;
        this.record(sessionId, message);
      }
    } catch (error) {
      failure = error.message;
    }
    this.run = { runId, calls: [], failure: "" };
    if (sessionId) {
      try {
        const found = await this.api.call("GET", `/v1/sessions/${encodeURIComponent(sessionId)}/model_calls`, { query: { run_id: runId } });
        this.run.calls = found.calls || [];
      } catch (error) {
        this.run.failure = error.message;
      }
    }
    if (location.hash !== `#/dev/${encodeURIComponent(runId)}`) return; // the user went elsewhere meanwhile
    if (sessionId) this.session = sessionId;
    this.#render(mount);
    mount.querySelector("h2").focus();
    if (failure) mount.querySelector(".view-status").textContent = failure;
  }

  // The run's model calls, oldest first: each one's request (messages, tools, parameters) and
  // response (text, tool calls, usage), as recorded.
  #calls() {
    const { runId, calls, failure } = this.run;
    const body = failure ? h("p", { class: "muted" }, failure)
      : calls.length ? h("ol", { class: "dev-calls", "aria-label": "Model calls" }, calls.map((call, i) => this.#call(call, i + 1)))
        : h("p", { class: "muted" }, "No model call recorded for this run: they are recorded when its session's switch above, or the deployment's AGENTMESH_AGENT_RECORD_MODEL_CALLS, is on.");
    return h("section", { class: "dev-calls-section", "aria-labelledby": "dev-calls-title" },
      h("h3", { id: "dev-calls-title" }, `Model calls of ${runId}`), body);
  }

  #call(call, n) {
    const parse = (text) => {
      try {
        return JSON.parse(text || "{}");
      } catch {
        return { unreadable: text };
      }
    };
    const sent = parse(call.request_json);
    const got = parse(call.response_json);
    const usage = got.usage || {};
    const cut = (side) => side.truncated ? h("p", { class: "muted small" }, `Cut: the first characters of ${side.chars}.`) : null;
    const request = sent.truncated ? h("pre", { class: "dev-payload" }, sent.head)
      : [h("ol", { class: "dev-messages", "aria-label": `Request messages of call ${n}` },
        (sent.messages || []).map((m) => h("li", { class: "dev-message", dataset: { role: m.role } },
          h("strong", {}, m.role),
          h("pre", { class: "dev-payload" }, [m.content, m.tool_calls ? JSON.stringify(m.tool_calls, null, 2) : ""].filter(Boolean).join("\n"))))),
      h("p", { class: "small dev-tools" }, `Tools: ${(sent.tools || []).map((t) => t.name).join(", ") || "none"}`),
      h("pre", { class: "dev-payload dev-parameters" }, JSON.stringify(sent.parameters || {}, null, 2))];
    const response = got.truncated ? h("pre", { class: "dev-payload" }, got.head)
      : h("pre", { class: "dev-payload dev-response" }, JSON.stringify(got, null, 2));
    return h("li", { class: "dev-call", dataset: { call: String(n) } },
      h("details", {},
        h("summary", {}, h("code", {}, `Call ${n} · ${call.model}`), " ",
          h("span", { class: "muted small" }, `${call.purpose || "turn"} · ${usage.input_tokens ?? 0} in, ${usage.output_tokens ?? 0} out${call.truncated ? " · cut" : ""}`)),
        h("h4", {}, "Request"), cut(sent), request,
        h("h4", {}, "Response"), cut(got), response));
  }

  #visible(entry) {
    return !this.hidden.has(entry.type) && (!this.session || entry.sessionId === this.session);
  }

  #row(entry) {
    const payload = entry.data && typeof entry.data === "object" && entry.type in entry.data ? entry.data[entry.type] : entry.data;
    return h("li", { class: "dev-event", dataset: { type: entry.type } },
      h("details", {},
        h("summary", {}, h("code", {}, entry.type), " ",
          h("span", { class: "muted small" }, `${new Date(entry.at).toLocaleTimeString()} · ${entry.sessionId}${entry.id ? ` · id ${entry.id}` : ""}`)),
        h("pre", { class: "dev-payload" }, JSON.stringify(payload, null, 2))));
  }
}
