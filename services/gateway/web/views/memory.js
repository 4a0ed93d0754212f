// Long-term memory of a namespace: browse or search it, read where a memory came from (its
// session and metadata), forget one (Gateway.ListMemories, SearchMemory, GetMemory, ForgetMemory).

import { confirmButton, enc, formatTime, frame, h, namespaceForm, sessionLink } from "./common.js";

export class MemoryView {
  constructor(api) {
    this.api = api;
    this.namespace = "default";
    this.query = "";
  }

  async show(mount) {
    const view = frame(mount, "Memory", "What the agent remembers across sessions: facts, preferences, learnings.");
    const query = h("input", { id: "memory-query", type: "search", value: this.query, autocomplete: "off",
      placeholder: "words to look for (empty: list)" });
    const results = h("ul", { class: "memory-list", "aria-label": "Memories" });
    view.body.append(namespaceForm("memory", this.namespace, (ns) => {
      this.namespace = ns;
      this.query = query.value.trim();
      this.show(mount);
    }, h("label", { for: "memory-query" }, "Search"), query), results);
    view.say("Loading memories…");
    try {
      const memories = this.query
        ? (await this.api.call("POST", "/v1/memory/search", { body: { namespace: this.namespace, query: this.query, k: 50 } })).hits || []
        : ((await this.api.call("GET", `/v1/namespaces/${enc(this.namespace)}/memories`, { query: { page_size: 200 } })).memories || [])
          .sort((a, b) => b.created_at - a.created_at);
      view.say(`${memories.length} ${this.query ? "matches" : "memories"} in ${this.namespace}`);
      if (!memories.length) results.append(h("li", { class: "muted" }, this.query ? "Nothing matches." : "Nothing remembered yet."));
      results.append(...memories.map((memory) => this.#item(memory, view)));
    } catch (error) {
      view.say(error.message);
    }
  }

  #item(memory, view) {
    const provenance = h("div", { class: "provenance", hidden: true });
    const item = h("li", { class: "memory card", dataset: { memory: memory.id } },
      h("p", { class: "memory-text" }, memory.text),
      h("p", { class: "muted small" }, `${memory.kind || "memory"} · ${formatTime(memory.created_at)}`,
        memory.score ? ` · score ${Number(memory.score).toFixed(2)}` : ""),
      h("div", { class: "actions" },
        h("button", { type: "button", class: "secondary", "aria-expanded": "false", "aria-label": `Provenance of: ${memory.text.slice(0, 60)}`,
          onclick: (event) => this.#provenance(event.currentTarget, provenance, memory, view) }, "Provenance"),
        confirmButton("Forget", "Press again to forget", async () => {
          try {
            await this.api.call("DELETE", `/v1/namespaces/${enc(this.namespace)}/memories/${enc(memory.id)}`);
            item.remove();
            view.say(`Forgotten: “${memory.text.slice(0, 80)}”`);
          } catch (error) {
            view.say(error.message);
          }
        }, { "aria-label": `Forget: ${memory.text.slice(0, 60)}` })),
      provenance);
    return item;
  }

  async #provenance(button, box, memory, view) {
    const open = box.hidden;
    box.hidden = !open;
    button.setAttribute("aria-expanded", String(open));
    if (!open) return;
    try {
      const full = await this.api.call("GET", `/v1/namespaces/${enc(this.namespace)}/memories/${enc(memory.id)}`);
      const metadata = full.metadata && Object.keys(full.metadata).length ? JSON.stringify(full.metadata, null, 2) : "";
      box.replaceChildren(h("dl", { class: "facts" },
        h("dt", {}, "Id"), h("dd", {}, h("code", {}, full.id)),
        h("dt", {}, "From session"), h("dd", {}, full.source_session_id ? sessionLink(full.source_session_id) : "(none recorded)"),
        h("dt", {}, "Stored"), h("dd", {}, formatTime(full.created_at)),
        full.updated_at && full.updated_at !== full.created_at ? [h("dt", {}, "Updated"), h("dd", {}, formatTime(full.updated_at))] : null,
        h("dt", {}, "Metadata"), h("dd", {}, metadata ? h("pre", {}, metadata) : "(none)")));
    } catch (error) {
      view.say(error.message);
    }
  }
}
