// A session's task board: the latest `tasks` entry of its transcript (the agent writes the whole
// board there after every change, docs/agent.md), as columns by status.

import { enc, frame, h } from "./common.js";

const COLUMNS = [["pending", "To do"], ["in_progress", "In progress"], ["done", "Done"], ["cancelled", "Cancelled"]];

export class TasksView {
  constructor(api, { sessions }) {
    this.api = api;
    this.sessions = sessions; // () => the sessions the sidebar lists
  }

  async show(mount, sessionId = "") {
    const view = frame(mount, "Task board", "The plan the agent keeps for a session (task_create, task_update, plan mode).");
    const select = h("select", { id: "tasks-session" },
      h("option", { value: "" }, "Choose a session…"),
      this.sessions().map((s) => h("option", { value: s.session_id, selected: s.session_id === sessionId }, s.title || s.session_id)));
    select.addEventListener("change", () => {
      location.hash = select.value ? `#/tasks/${enc(select.value)}` : "#/tasks";
    });
    view.body.append(h("form", { class: "view-form" }, h("label", { for: "tasks-session" }, "Session"), select));
    if (!sessionId) {
      view.say("Choose a session to see its board.");
      return;
    }
    view.say("Loading the board…");
    try {
      let board = null;
      for (let after = 0; ;) {
        const page = await this.api.call("GET", `/v1/sessions/${enc(sessionId)}/transcript`, { query: { after_seq: after, page_size: 1000 } });
        for (const message of page.messages || []) if (message.kind === "tasks") board = message;
        if (!Number(page.next_after_seq)) break;
        after = page.next_after_seq;
      }
      const tasks = board ? JSON.parse(board.content).tasks || [] : [];
      const open = tasks.filter((t) => t.status === "pending" || t.status === "in_progress").length;
      view.say(board ? `${tasks.length} tasks, ${open} open` : "This session has no task board yet.");
      const done = new Set(tasks.filter((t) => t.status === "done").map((t) => t.id));
      view.body.append(h("div", { class: "board" }, COLUMNS.map(([status, title]) => {
        const items = tasks.filter((t) => t.status === status);
        return h("section", { class: "board-column card", "aria-labelledby": `col-${status}` },
          h("h3", { id: `col-${status}` }, `${title} (${items.length})`),
          h("ul", { class: "board-tasks" }, items.map((task) => {
            const waits = (task.blocked_by || []).filter((id) => !done.has(id));
            return h("li", { class: "board-task", dataset: { task: String(task.id) } },
              h("strong", {}, `#${task.id} ${task.subject}`),
              task.description ? h("p", { class: "small" }, task.description) : null,
              task.owner ? h("p", { class: "muted small" }, `owner: ${task.owner}`) : null,
              waits.length ? h("p", { class: "held small" }, `waits for ${waits.map((id) => `#${id}`).join(", ")}`) : null);
          })));
      })));
    } catch (error) {
      view.say(error.message);
    }
  }
}
