// Activity across sessions: the recent runs (GET /v1/runs) and, live, every running turn's
// starts, tool calls, approvals and ends (GET /v1/activity, WatchActivity as SSE).

import { duration, formatTime, frame, h, sessionLink, streamGet, table, tokens } from "./common.js";

const LIVE_ROWS = 200;

function describe(kind, payload) {
  if (!payload) return "";
  if (kind === "run_started") return payload.model ? `model ${payload.model}` : "";
  if (kind === "tool_call") return payload.name || "";
  if (kind === "tool_result") return `${payload.result?.name || ""}${payload.result?.is_error ? " (failed)" : ""}`;
  if (kind === "approval_request") return `${payload.name || payload.call?.name || ""} waits for approval`;
  if (kind === "run_finished") return payload.stop_reason || "";
  if (kind === "error") return payload.message || payload.code || "";
  return "";
}

export class ActivityView {
  constructor(api, { showTrace }) {
    this.api = api;
    this.showTrace = showTrace;
    this.abort = null;
  }

  hide() {
    if (this.abort) this.abort.abort();
    this.abort = null;
  }

  async show(mount) {
    this.hide();
    const view = frame(mount, "Activity", "What runs across sessions: the recent runs, and live events as they happen.");
    const runs = h("section", { class: "card", "aria-labelledby": "activity-runs" }, h("h3", { id: "activity-runs" }, "Recent runs"));
    const live = h("ol", { class: "live-list", id: "activity-live" });
    view.body.append(runs, h("section", { class: "card", "aria-labelledby": "activity-live-title" },
      h("h3", { id: "activity-live-title" }, "Live"),
      h("div", { role: "log", "aria-label": "Live activity", "aria-live": "off" }, live)));
    this.#watch(live, view);
    try {
      const reply = await this.api.call("GET", "/v1/runs", { query: { page_size: 50 } });
      const rows = (reply.runs || []).map((run) => {
        const usage = run.usage || {};
        return h("tr", { dataset: { run: run.run_id } },
          h("td", {}, sessionLink(run.session_id)),
          h("td", {}, h("span", { class: `state state-${run.state}` }, run.state)),
          h("td", {}, formatTime(run.created_at)),
          h("td", { class: "num" }, duration(run.finished_at ? run.finished_at - (run.started_at || run.created_at) : 0)),
          h("td", { class: "num" }, tokens(usage.total_tokens)),
          h("td", { class: "actions" },
            h("a", { href: `#/dev/${encodeURIComponent(run.run_id)}`, "aria-label": `Events of ${run.run_id}` }, "Events"),
            run.trace_id
              ? h("button", { type: "button", class: "link", "aria-label": `Trace of ${run.run_id}`,
                onclick: () => this.showTrace(run.session_id, run.trace_id) }, `Trace ${run.trace_id.slice(0, 8)}`)
              : null));
      });
      runs.append(rows.length
        ? table("Recent runs", ["Session", "State", "Started", "Took", "Tokens", "Events and trace"], rows)
        : h("p", { class: "muted" }, "No runs yet."));
      view.say(`${rows.length} recent runs · watching for live events`);
    } catch (error) {
      view.say(error.message);
    }
  }

  async #watch(list, view) {
    const abort = new AbortController();
    this.abort = abort;
    try {
      for await (const message of streamGet(this.api, "/v1/activity", abort.signal)) {
        const item = message.data;
        if (message.event === "message") continue; // a replica's hello: its turns are watched from now
        const row = h("li", { class: "live-row", dataset: { kind: message.event } },
          h("span", { class: "muted small" }, new Date(item.timestamp * 1000).toLocaleTimeString()), " ",
          sessionLink(item.session_id), " ",
          h("strong", {}, message.event.replace("_", " ")), " ",
          h("span", {}, describe(message.event, item[message.event])));
        list.prepend(row);
        while (list.children.length > LIVE_ROWS) list.lastChild.remove();
      }
    } catch (error) {
      if (!abort.signal.aborted) view.say(`The live feed stopped: ${error.message}`);
    }
  }
}
