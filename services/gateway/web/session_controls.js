// The composer's choices, as the CLI offers them: the named agent each message runs
// (ChatOptions.agent, `chat --agent`), the session's model and permission mode (kept
// with the session: UpdateSession), plan mode for the next message, what a message sent while a
// turn runs does (ChatOptions.if_busy), and how full the model's context window is.

const BUSY_WORDS = {
  interrupt: "Stops the running turn at its next safe point, then answers this message.",
  enqueue: "Waits for the running turn to end, then runs this message.",
  reject: "Sends only when nothing runs: refused while a turn runs.",
};

export class SessionControls {
  // elements: { agent, model, permissionMode, plan, deep, ifBusy, busyRow, busyHint, contextFill, status }
  constructor(api, elements) {
    this.api = api;
    this.el = elements;
    this.sessionId = "";
    this.agentsOf = "";  // the namespace whose agents the picker lists
    this.modelsOf = "";  // the namespace whose own models the model picker lists too ("": none)
    this.el.model.addEventListener("change", () => this.#update({ model: this.el.model.value }, ["model"]));
    this.el.permissionMode.addEventListener("change",
      () => this.#update({ permission_mode: this.el.permissionMode.value }, ["permission_mode"]));
    this.el.ifBusy.addEventListener("change", () => this.#busyHint());
    this.#busyHint();
  }

  // The deployment's models, and with a namespace (a session's) that namespace's own (ModelConfigs).
  async loadModels(namespace = "", chosen = this.el.model.value) {
    const load = (this.modelLoads = (this.modelLoads || 0) + 1);
    const query = namespace ? `?namespace=${encodeURIComponent(namespace)}` : "";
    const reply = await this.api.call("GET", `/v1/models${query}`);
    if (load !== this.modelLoads) return;
    this.modelsOf = namespace;
    this.el.model.replaceChildren(...reply.models.map((model) => {
      const option = document.createElement("option");
      option.value = model.name === "default" ? "" : model.name;
      option.textContent = model.name === "default" ? `default (${model.model})`
        : model.namespace ? `${model.name} (${model.namespace})` : model.name;
      return option;
    }));
    this.el.model.value = chosen;
    if (this.el.model.value !== chosen) this.el.model.value = "";
  }

  // The agents of the namespace (ListAgents): the built-ins and those it defines.
  async loadAgents(namespace = "default", chosen = this.el.agent.value) {
    // Only the latest load applies: one started at page load may answer after a session's own.
    const load = (this.agentLoads = (this.agentLoads || 0) + 1);
    const reply = await this.api.call("GET", `/v1/namespaces/${encodeURIComponent(namespace)}/agents`);
    if (load !== this.agentLoads) return;
    this.agentsOf = namespace;
    const agents = (reply.agents || []).map((agent) => {
      const option = document.createElement("option");
      option.value = agent.spec.name;
      option.textContent = agent.spec.name;
      option.title = agent.spec.description || "";
      return option;
    });
    const none = document.createElement("option");
    none.value = "";
    none.textContent = "default";
    this.el.agent.replaceChildren(none, ...agents);
    this.el.agent.value = chosen;
    if (this.el.agent.value !== chosen) this.el.agent.value = "";
  }

  // A session was opened (or none: a new conversation starts with the deployment's choices).
  show(session) {
    this.sessionId = session ? session.session_id : "";
    // The agent its latest turn ran is the one its next message runs, unless another is picked.
    const agent = session ? session.agent || "" : "";
    const namespace = session ? session.namespace || "default" : "default";
    this.el.agent.value = agent;
    if (namespace !== this.agentsOf || this.el.agent.value !== agent) this.loadAgents(namespace, agent).catch(() => {});
    const model = session ? session.model || "" : "";
    this.el.model.value = model;
    if (session && (namespace !== this.modelsOf || this.el.model.value !== model)) {
      this.loadModels(namespace, model).catch(() => {});
    }
    if (this.el.model.value !== model) this.el.model.value = "";
    this.el.permissionMode.value = session ? session.permission_mode || "" : "";
    this.el.contextFill.hidden = true;
  }

  // A session was just created for the first message: it takes the choices made before it existed.
  async created(sessionId) {
    this.sessionId = sessionId;
    const body = {};
    const mask = [];
    if (this.el.model.value) { body.model = this.el.model.value; mask.push("model"); }
    if (this.el.permissionMode.value) { body.permission_mode = this.el.permissionMode.value; mask.push("permission_mode"); }
    if (mask.length) await this.#update(body, mask);
  }

  // The options of a message; `busy` when a turn of the session runs already.
  options(busy) {
    const options = {};
    if (this.el.agent.value) options.agent = this.el.agent.value;
    if (this.el.deep.checked) options.mode = "deep";
    if (this.el.plan.checked) options.plan = true;
    if (busy) options.if_busy = this.el.ifBusy.value;
    return options;
  }

  running(running) {
    this.el.busyRow.hidden = !running;
  }

  // The context-fill figure of a turn's last status event.
  contextFill(tokens, window) {
    if (!window) return;
    const share = Math.min(100, Math.round((tokens * 100) / window));
    this.el.contextFill.hidden = false;
    this.el.contextFill.querySelector("meter").value = share;
    this.el.contextFill.querySelector(".context-text").textContent =
      `Context ${share}% full (${Number(tokens).toLocaleString("en")} of ${Number(window).toLocaleString("en")} tokens)`;
  }

  async #update(body, mask) {
    if (!this.sessionId) return; // applied when the first message creates the session
    this.el.status.textContent = "";
    try {
      const session = await this.api.call("PATCH", `/v1/sessions/${encodeURIComponent(this.sessionId)}`,
        { body: { ...body, update_mask: mask } });
      this.el.status.textContent = mask.includes("model")
        ? `The next turns use ${session.model || "the default model"}.`
        : `Permission mode: ${session.permission_mode || "the deployment's"}.`;
    } catch (error) {
      if (error.code === "NOT_FOUND") return; // not created yet: the first message creates it
      this.el.status.textContent = error.message;
    }
  }

  #busyHint() {
    this.el.busyHint.textContent = BUSY_WORDS[this.el.ifBusy.value] || "";
  }
}
