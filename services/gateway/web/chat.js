// The conversation: a session's history from its transcript, and a running turn from its events.

import { formatMs, h, prettyJson } from "./dom.js";
import { imageStrip } from "./images.js";
import { WindowedList } from "./windowed.js";

const STEP = /step (\d+) of (\d+)/;
// Transcripts with more entries than this are rendered as a window over them.
const WINDOW_FROM = 150;

// `?render=all` (or localStorage agentmesh.render = "all") renders every entry: the bench's baseline.
function fullRenderingAsked() {
  return new URLSearchParams(location.search).get("render") === "all" || localStorage.getItem("agentmesh.render") === "all";
}

// The transcript as entries of the conversation: a step's tool calls carry their results.
function historyItems(messages) {
  const items = [];
  const stepOf = new Map(); // call id -> the assistant entry that made the call
  for (const message of messages) {
    const seq = Number(message.seq);
    if (message.role === "user") items.push({ kind: "user", message, seqs: [seq] });
    else if (message.role === "assistant") {
      const item = { kind: "assistant", message, results: new Map(), seqs: [seq] };
      for (const call of message.tool_calls || []) stepOf.set(call.call_id, item);
      if (message.content || (message.tool_calls || []).length) items.push(item);
    } else if (message.role === "tool") {
      const step = stepOf.get(message.tool_call_id);
      if (step) {
        step.results.set(message.tool_call_id, message);
        step.seqs.push(seq);
      } else items.push({ kind: "tool", message, seqs: [seq] });
    } else if (message.kind === "summary") items.push({ kind: "summary", message, seqs: [seq] });
    else if (message.content) items.push({ kind: "note", message, seqs: [seq] });
  }
  return items;
}

export class Conversation {
  // actions: { approve(callId, approved), showTrace(traceId), openSession(id), runsCode(toolName),
  //            latestPlan(afterSeq), fork(seq), imageUrl(image) }
  constructor(log, actions) {
    this.log = log;
    this.actions = actions;
  }

  clear() {
    if (this.windowed) this.windowed.detach();
    this.windowed = null;
    this.items = [];
    this.log.replaceChildren();
  }

  // The transcript, as the model saw it: messages, tool calls with their results, summaries.
  // A long one is rendered as a window over it (windowed.js): only what is in view is in the page.
  renderHistory(messages) {
    this.items = historyItems(messages);
    this.windowed = null;
    if (this.items.length > WINDOW_FROM && !fullRenderingAsked()) {
      this.windowed = new WindowedList(this.log, this.items.length, (index) => this.#renderItem(this.items[index]));
      this.windowed.scrollToEnd();
      return;
    }
    for (const item of this.items) this.log.append(this.#renderItem(item));
    this.scroll();
  }

  // Bring the message with `seq` into view and give it focus (a deep link: #/sessions/ID/messages/SEQ).
  reveal(seq) {
    const index = (this.items || []).findIndex((item) => item.seqs.includes(Number(seq)));
    if (index < 0) return false;
    const show = (element) => {
      const target = element.querySelector(`[data-seq="${Number(seq)}"]`) || element;
      target.classList.add("linked");
      target.tabIndex = -1;
      target.scrollIntoView({ block: "center" });
      target.focus({ preventScroll: true });
    };
    if (this.windowed) this.windowed.scrollToIndex(index, show);
    else show(this.log.children[index]);
    return true;
  }

  #renderItem(item) {
    const message = item.message;
    switch (item.kind) {
      case "user":
        return this.#forkable(bubble("user", message.content, message.seq, message.images), message.seq);
      case "assistant": {
        const group = h("div", { class: "history-step", dataset: { seq: message.seq } });
        if (message.content) group.append(this.#forkable(bubble("assistant", message.content, message.seq), message.seq));
        for (const call of message.tool_calls || []) {
          const card = new ToolCard(call.call_id, call.name, call.arguments_json, this.actions);
          const result = item.results.get(call.call_id);
          if (result) card.recorded(result.content, result.images);
          group.append(card.element);
        }
        return group;
      }
      case "tool": {
        const card = new ToolCard(message.tool_call_id, message.name, "", this.actions);
        card.recorded(message.content, message.images);
        return card.element;
      }
      case "summary":
        return h("details", { class: "summary-card" },
          h("summary", {}, `Summary of earlier messages (through #${message.covers_through_seq})`),
          h("p", { class: "summary-text" }, message.content));
      default:
        return h("p", { class: "note" }, message.content);
    }
  }

  // Time travel: a stored message offers a new session that holds the conversation up to it.
  #forkable(element, seq) {
    if (!seq || !this.actions.fork) return element;
    const status = h("span", { class: "muted small", role: "status" });
    const button = h("button", { type: "button", class: "link fork", "aria-label": `Fork the conversation at #${seq}`,
      title: "A new session with the conversation up to here and a copy of the workspace" }, "Fork from here");
    button.addEventListener("click", async () => {
      button.disabled = true;
      status.textContent = "Forking…";
      try {
        await this.actions.fork(Number(seq));
      } catch (error) {
        status.textContent = error.message;
        button.disabled = false;
      }
    });
    const link = this.actions.messageLink
      ? h("a", { class: "permalink", href: this.actions.messageLink(seq), "aria-label": `Link to #${seq}` }, `#${seq}`) : null;
    // Beside the bubble, not in it: the bubble holds the message alone.
    return h("div", { class: `message ${element.classList.contains("user") ? "user" : "assistant"}` },
      element, h("div", { class: "message-actions" }, link, link ? " " : null, button, " ", status));
  }

  startTurn(text, images = []) {
    this.log.append(bubble("user", text, undefined, images));
    const turn = new LiveTurn(this, this.actions);
    this.log.append(turn.element);
    this.scroll();
    return turn;
  }

  scroll() {
    this.log.scrollTop = this.log.scrollHeight;
  }
}

function bubble(role, text, seq, images) {
  return h("article", { class: `bubble ${role}`, "aria-label": role === "user" ? "You" : "Agent", dataset: seq ? { seq } : undefined },
    h("p", { class: "who" }, role === "user" ? "You" : "Agent"),
    h("div", { class: "text" }, text),
    imageStrip(images));
}

class LiveTurn {
  constructor(conversation, actions) {
    this.conversation = conversation;
    this.actions = actions;
    this.cards = new Map();
    this.text = null;
    this.progress = null;
    this.traceId = "";
    this.position = null; // the transcript position the turn began at (from its event ids)
    this.element = h("section", { class: "turn", "aria-label": "Agent's turn" });
    this.footer = h("footer", { class: "turn-footer" });
  }

  handle(kind, event, id = "") {
    if (this.position === null && id.includes(".")) this.position = Number(id.split(".")[0]);
    const payload = event[kind];
    switch (kind) {
      case "run_started":
        this.traceId = payload.trace_id;
        break;
      case "text_delta":
        if (!this.text) {
          this.text = bubble("assistant", "");
          this.element.append(this.text);
        }
        this.text.querySelector(".text").append(payload.text);
        break;
      case "tool_call": {
        this.text = null; // text after the call starts a new bubble
        const card = new ToolCard(payload.call_id, payload.name, payload.arguments_json, this.actions);
        card.running();
        this.cards.set(payload.call_id, card);
        this.element.append(card.element);
        break;
      }
      case "tool_result": {
        const result = payload.result;
        let card = this.cards.get(result.call_id);
        if (!card) {
          card = new ToolCard(result.call_id, result.name, "", this.actions);
          this.element.append(card.element);
        }
        card.finished(result);
        const child = result.data && result.data.session_id;
        if (result.name === "delegate_task" && child) card.linkSession(child);
        break;
      }
      case "approval_request":
        this.#card(payload.call_id, payload.name, payload.arguments_json).held(payload);
        break;
      case "approval_resolved":
        this.#card(payload.call_id, payload.name, "").resolved(payload);
        break;
      case "status":
        // The context-fill figure (a turn's last status) goes to the composer, not the progress list.
        if (Number(payload.context_window)) this.actions.contextFill?.(Number(payload.context_tokens), Number(payload.context_window));
        else this.#status(payload.message);
        break;
      case "reasoning_delta":
        this.#reasoning(payload.text);
        break;
      case "task_update":
        this.#tasks(payload.tasks || []);
        break;
      case "subagent":
        this.#subagent(payload);
        break;
      case "background_result": {
        const card = new ToolCard(payload.id, `background ${payload.id}`, JSON.stringify({ command: payload.command }), this.actions);
        card.finished({ ...payload.result, duration_ms: (payload.seconds || 0) * 1000 });
        if (payload.status === "stopped") card.note("Stopped before it ended.");
        this.element.append(card.element);
        break;
      }
      case "run_finished":
        this.#finished(payload);
        break;
      case "error":
        this.element.append(h("p", { class: "error", role: "alert" }, `${payload.code}: ${payload.message}`));
        this.#footer({});
        break;
      default:
        break;
    }
    this.conversation.scroll();
  }

  // The model's reasoning, apart from its answer: folded away unless opened.
  #reasoning(text) {
    if (!this.reasoningText) {
      this.reasoningText = h("div", { class: "reasoning-text" });
      this.element.append(h("details", { class: "reasoning-card" }, h("summary", {}, "Reasoning"), this.reasoningText));
    }
    this.reasoningText.append(text);
    this.text = null; // the answer after it starts a bubble of its own
  }

  // A sub-agent's start and end, as a line of the progress list (its steps are status lines there too).
  #subagent(a) {
    const who = `sub-agent ${a.index}${a.agent ? ` ${a.agent}@${a.agent_version || 0}` : ""}`;
    const usage = a.usage || {};
    const text = a.state === "started"
      ? `${who} started: ${a.task}`
      : `${who} finished (${a.stop_reason}): ${Number(a.iterations || 0)} model call(s), ${Number(usage.total_tokens || 0)} tokens`;
    this.#progressCard();
    this.progressList.append(h("li", { class: "subagent", dataset: { state: a.state, session: a.session_id } }, text));
  }

  // The session's task board, whole after each change.
  #tasks(tasks) {
    if (!this.taskList) {
      this.taskList = h("ol", { class: "task-list" });
      this.taskCount = h("span", { class: "muted" });
      this.element.append(h("details", { class: "tasks-card", open: true, "aria-label": "Task board" },
        h("summary", {}, "Tasks ", this.taskCount), this.taskList));
    }
    const done = tasks.filter((task) => task.status === "done").length;
    this.taskCount.textContent = `${done} of ${tasks.length} done`;
    const marks = { done: "✔", in_progress: "▶", cancelled: "✖", pending: "○" };
    this.taskList.replaceChildren(...tasks.map((task) =>
      h("li", { class: `task ${task.status}`, dataset: { status: task.status } },
        h("span", { class: "task-mark", "aria-hidden": "true" }, marks[task.status] || "○"), " ",
        `#${task.id} ${task.subject}`,
        h("span", { class: "muted" }, ` — ${task.status.replace("_", " ")}${task.blocked ? ", blocked" : ""}${task.owner ? `, ${task.owner}` : ""}`))));
  }

  #card(callId, name, args) {
    let card = this.cards.get(callId);
    if (!card) {
      card = new ToolCard(callId, name, args, this.actions);
      this.cards.set(callId, card);
      this.element.append(card.element);
    }
    return card;
  }

  #progressCard() {
    if (!this.progress) {
      this.progressBar = h("progress", { max: 1, value: 0, "aria-label": "Progress of the deep work", hidden: true });
      this.progressList = h("ol", { class: "status-list" });
      this.progress = h("details", { class: "progress-card", open: true },
        h("summary", {}, "Progress"), this.progressBar, this.progressList);
      this.element.append(this.progress);
    }
  }

  #status(message) {
    this.#progressCard();
    const step = STEP.exec(message);
    if (step) {
      this.progressBar.hidden = false;
      this.progressBar.max = Number(step[2]);
      this.progressBar.value = Number(step[1]);
    }
    this.progressList.append(h("li", {}, message));
    if (message.startsWith("plan ready")) this.#showPlan();
  }

  // Deep work's plan is not streamed: it is written to the transcript, so read it from there.
  async #showPlan() {
    if (this.position === null) return;
    try {
      const plan = await this.actions.latestPlan(this.position);
      if (!plan) return;
      if (!this.plan) {
        this.plan = h("pre", { class: "plan", "aria-label": "The agent's plan" });
        this.progressList.before(this.plan);
      }
      this.plan.textContent = plan;
    } catch {
      // The progress list still says how far the work is.
    }
  }

  #finished(finished) {
    if (this.progress) this.#showPlan(); // a revised plan, if the agent reflected
    if (finished.stop_reason && finished.stop_reason !== "completed") {
      this.element.append(h("p", { class: "note" }, `Stopped: ${finished.stop_reason.replace("_", " ")}`));
    }
    this.traceId = finished.trace_id || this.traceId;
    this.#footer(finished);
  }

  #footer(finished) {
    const usage = finished.usage || {};
    const parts = [];
    if (usage.total_tokens) {
      parts.push(`${usage.input_tokens || 0} in · ${usage.output_tokens || 0} out · ${usage.total_tokens} tokens`);
    }
    if (finished.iterations) parts.push(`${finished.iterations} iteration${finished.iterations === 1 ? "" : "s"}`);
    this.footer.replaceChildren(h("span", { class: "usage" }, parts.join(" · ")));
    if (this.traceId) {
      const traceId = this.traceId;
      this.footer.append(h("button", { type: "button", class: "link", onclick: () => this.actions.showTrace(traceId) }, "Trace"));
    }
    this.element.append(this.footer);
  }
}

class ToolCard {
  constructor(callId, name, argumentsJson, actions) {
    this.callId = callId;
    this.actions = actions;
    this.status = h("span", { class: "tool-status" }, "");
    this.output = h("pre", { class: "tool-output" });
    this.extra = h("div", { class: "tool-extra" });
    this.element = h("details", { class: "tool-card", dataset: { callId, state: "done" } },
      h("summary", {}, h("span", { class: "tool-name" }, name || "tool"), " ", this.status),
      argumentsJson ? h("div", {}, h("h4", {}, "Arguments"), h("pre", { class: "tool-args" }, prettyJson(argumentsJson))) : null,
      this.extra,
      this.result = h("div", { class: "tool-result", hidden: true }, h("h4", {}, "Result"), this.output));
  }

  #state(state, text) {
    this.element.dataset.state = state;
    this.status.textContent = text;
  }

  running() {
    this.#state("running", "running…");
  }

  recorded(content, images) {
    this.output.textContent = content;
    this.result.hidden = false;
    this.#state("done", "done");
    this.#figures(images);
  }

  // A result's images (a figure the python kernel drew, an image read_file read): fetched from
  // the session's workspace and shown in the result, the card opened so they are seen at once.
  #figures(images) {
    if (!images || !images.length || !this.actions.imageUrl) return;
    const strip = h("div", { class: "tool-figures" });
    this.result.append(strip);
    this.element.open = true;
    for (const image of images) {
      const label = image.name || image.path;
      const slot = h("span", { class: "image-ref small muted" }, `[image: ${label}]`);
      strip.append(slot);
      this.actions.imageUrl(image).then((url) => {
        if (url) slot.replaceWith(h("img", { src: url, alt: label, class: "tool-figure" }));
      }, () => {});
    }
  }

  finished(result) {
    const parts = [];
    if (result.is_error) parts.push(result.error_kind ? `error: ${result.error_kind}` : "error");
    else parts.push("ok");
    if (this.actions.runsCode(result.name) || result.exit_code) parts.push(`exit ${result.exit_code}`);
    if (result.duration_ms) parts.push(formatMs(result.duration_ms));
    this.#state(result.is_error ? "error" : "ok", parts.join(" · "));
    this.output.textContent = result.output;
    this.result.hidden = false;
    if (result.stderr && result.stderr !== result.output) {
      this.extra.append(h("h4", {}, "stderr"), h("pre", { class: "tool-stderr" }, result.stderr));
    }
    if (result.truncated) this.extra.append(h("p", { class: "muted" }, "Output was cut at the service's limit."));
    this.#figures(result.images);
  }

  // A held call: approve it, approve it and the rest of the turn, edit its arguments and
  // approve those, or deny it with a note the model reads.
  held(request) {
    this.element.open = true;
    this.#state("held", "waiting for approval");
    const isPlan = request.name === "approve_plan";
    const approve = h("button", { type: "button", class: "approve" }, isPlan ? "Approve the plan" : "Approve");
    const rest = h("button", { type: "button", class: "approve-rest" }, "Approve the rest of this turn");
    const edit = h("button", { type: "button", class: "edit-args", "aria-expanded": "false" }, "Edit arguments");
    const deny = h("button", { type: "button", class: "danger deny" }, "Deny");
    const note = h("input", { type: "text", class: "deny-note", maxlength: 4000, autocomplete: "off" });
    const editor = h("textarea", { class: "args-editor", rows: 6, spellcheck: "false" });
    editor.value = prettyJson(request.arguments_json || "{}");
    const runEdited = h("button", { type: "button", class: "approve-edited" }, "Approve with these arguments");
    const editBox = h("div", { class: "args-edit", hidden: true },
      h("label", {}, "Arguments to run the call with (JSON)", editor), runEdited);
    const problem = h("p", { class: "error", role: "alert" });
    const buttons = [approve, rest, edit, deny, runEdited];
    const decide = async (decision) => {
      problem.textContent = "";
      for (const button of buttons) button.disabled = true;
      try {
        await this.actions.approve(this.callId, decision);
      } catch (error) {
        for (const button of buttons) button.disabled = false;
        problem.textContent = error.message;
      }
    };
    approve.addEventListener("click", () => decide({ approved: true }));
    rest.addEventListener("click", () => decide({ approved: true, rest_of_turn: true }));
    deny.addEventListener("click", () => decide({ approved: false, note: note.value.trim() }));
    edit.addEventListener("click", () => {
      editBox.hidden = !editBox.hidden;
      edit.setAttribute("aria-expanded", String(!editBox.hidden));
      if (!editBox.hidden) editor.focus();
    });
    runEdited.addEventListener("click", () => {
      try {
        const value = JSON.parse(editor.value);
        if (!value || typeof value !== "object" || Array.isArray(value)) throw new Error("a JSON object, as {\"name\": value}");
      } catch (error) {
        problem.textContent = `The arguments are not ${error.message.startsWith("a JSON") ? error.message : "valid JSON"}; the call still waits.`;
        editor.focus();
        return;
      }
      decide({ approved: true, arguments_json: editor.value });
    });
    const seconds = Math.round(request.timeout_s || 0);
    let plan = null;
    if (isPlan) {
      try {
        plan = h("pre", { class: "plan", "aria-label": "The plan to approve" }, JSON.parse(request.arguments_json).plan || "");
      } catch {
        plan = null;
      }
    }
    this.approval = h("div", { class: "approval", role: "group", "aria-label": `Approve ${request.name}?` },
      h("p", {}, (isPlan ? "The agent asks you to approve its plan before it starts." : `The agent wants to run ${request.name}.`) +
        (seconds ? ` Denied automatically in ${seconds} s.` : "")),
      plan,
      h("div", { class: "approval-buttons" }, approve, " ", rest, " ", isPlan ? null : edit, " ", deny),
      isPlan ? null : editBox,
      h("label", { class: "deny-note-label" }, isPlan ? "What to change (sent with a denial)" : "Why (sent to the model with a denial)", note),
      problem);
    this.extra.append(this.approval);
    approve.focus();
  }

  resolved(resolution) {
    if (this.approval) this.approval.remove();
    const who = resolution.decided_by === "timeout" ? "no decision in time" : "by you";
    const how = resolution.approved ? (resolution.arguments_json ? "Approved with edited arguments" : "Approved") : "Denied";
    this.extra.append(h("p", { class: "muted resolution" }, `${how} (${who})${resolution.note ? `: ${resolution.note}` : ""}`));
    if (resolution.arguments_json) {
      this.extra.append(h("div", {}, h("h4", {}, "Ran with"), h("pre", { class: "tool-args edited" }, prettyJson(resolution.arguments_json))));
    }
    if (resolution.approved) this.#state("running", "running…");
  }

  note(text) {
    this.extra.append(h("p", { class: "muted" }, text));
  }

  linkSession(sessionId) {
    this.extra.append(h("p", {},
      h("button", { type: "button", class: "link", onclick: () => this.actions.openSession(sessionId) }, `Open the sub-agent's session ${sessionId}`)));
  }
}
