// Memory blocks of a namespace (docs/memory.md, "Memory blocks"): the namespace's blocks and the
// signed-in person's own `user` block, as every turn's system prompt shows them; write one, read
// its history with where each version came from, revert to a version, decide the edits the agent
// proposed while the namespace holds them as drafts, and set that policy (Gateway.ListBlocks,
// GetBlock, SetBlock, RevertBlock, ApproveBlockEdit, RejectBlockEdit, SetBlockPolicy).

import { confirmButton, enc, formatTime, frame, h, namespaceForm, num, sessionLink, table } from "./common.js";

// Where a version or draft came from: who, the turn (session and message), the model.
function provenance(p = {}) {
  const parts = [p.by || "agent"];
  if (p.session_id) parts.push(h("span", {}, sessionLink(p.session_id), num(p.seq) ? ` #${num(p.seq)}` : ""));
  if (p.model) parts.push(p.model);
  return parts.flatMap((part, i) => (i ? [" · ", part] : [part]));
}

export class BlocksView {
  constructor(api) {
    this.api = api;
    this.namespace = "default";
  }

  path(suffix = "") {
    return `/v1/namespaces/${enc(this.namespace)}${suffix}`;
  }

  async show(mount, _arg, notice = "") {
    const view = frame(mount, "Memory blocks",
      "What the agent keeps current and every conversation of the namespace shows. Your user block is yours alone.");
    const list = h("ul", { class: "memory-list", "aria-label": "Blocks" });
    const drafts = h("div", {});
    const history = h("section", { class: "card block-history", "aria-labelledby": "block-history-title", hidden: true });
    const policy = h("select", { id: "blocks-policy", name: "edits" },
      h("option", { value: "apply" }, "apply at once"), h("option", { value: "draft" }, "wait for a person"));
    const policyForm = h("form", { class: "view-form", "aria-label": "Edit policy" },
      h("label", { for: "blocks-policy" }, "The agent's edits"), policy, h("button", { type: "submit" }, "Set"));
    policyForm.addEventListener("submit", (event) => {
      event.preventDefault();
      this.#act(mount, view, () => this.api.call("PUT", this.path("/block-policy"), { body: { edits: policy.value } }),
        `The agent's edits now ${policy.value === "apply" ? "apply at once" : "wait for a person"}.`);
    });
    view.body.append(namespaceForm("blocks", this.namespace, (ns) => { this.namespace = ns; this.show(mount); }),
      policyForm, list, this.#newBlockForm(mount, view), drafts, history);
    view.say(notice || "Loading blocks…");
    try {
      const reply = await this.api.call("GET", this.path("/blocks"));
      const blocks = reply.blocks || [];
      const waiting = reply.drafts || [];
      policy.value = reply.edits || "apply";
      if (!notice) view.say(`${blocks.length} block${blocks.length === 1 ? "" : "s"}, ${waiting.length} edit${waiting.length === 1 ? "" : "s"} waiting in ${this.namespace}`);
      if (!blocks.length) list.append(h("li", { class: "muted" }, "No blocks yet: the agent writes them with block_append."));
      list.append(...blocks.map((block) => this.#item(mount, view, block, history)));
      if (waiting.length) drafts.append(h("h3", {}, "Edits waiting for a person"), this.#drafts(mount, view, waiting));
    } catch (error) {
      view.say(error.message);
    }
  }

  // Runs a change, then shows the view again with `done` (or the refusal's sentence) said.
  async #act(mount, view, change, done) {
    try {
      await change();
      await this.show(mount, "", done);
    } catch (error) {
      view.say(error.message);
    }
  }

  #item(mount, view, block, history) {
    const label = block.user ? `${block.name} (yours)` : block.name;
    const editor = h("textarea", { id: `block-text-${block.name}`, rows: "4", spellcheck: "true" }, block.text);
    const form = h("form", { class: "block-edit", hidden: true },
      h("label", { for: `block-text-${block.name}` }, `New text of ${label}`), editor,
      h("button", { type: "submit" }, `Save ${block.name}`));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.#act(mount, view, () => this.api.call("PUT", this.path(`/blocks/${enc(block.name)}`), { body: { text: editor.value } }),
        `Saved ${block.name}.`);
    });
    const edit = h("button", { type: "button", class: "secondary", "aria-expanded": "false", "aria-label": `Edit ${label}`,
      onclick: (event) => {
        form.hidden = !form.hidden;
        event.currentTarget.setAttribute("aria-expanded", String(!form.hidden));
        if (!form.hidden) editor.focus();
      } }, "Edit");
    return h("li", { class: "memory card", dataset: { block: block.name } },
      h("h3", {}, label),
      h("pre", { class: "block-text", tabindex: "0", "aria-label": `Text of ${label}` }, block.text),
      h("p", { class: "muted small" }, `v${num(block.version)} · ${block.text.length}/${num(block.max_chars)} characters · ${formatTime(block.updated_at)}`),
      h("div", { class: "actions" }, edit,
        h("button", { type: "button", class: "secondary", "aria-label": `History of ${label}`,
          onclick: () => this.#history(mount, view, block, history) }, "History")),
      form);
  }

  #newBlockForm(mount, view) {
    const name = h("input", { id: "block-new-name", name: "name", autocomplete: "off", spellcheck: "false", placeholder: "user, project, persona…" });
    const text = h("textarea", { id: "block-new-text", rows: "2" });
    const form = h("form", { class: "view-form", "aria-label": "Write a block" },
      h("label", { for: "block-new-name" }, "Block"), name, h("label", { for: "block-new-text" }, "Text"), text,
      h("button", { type: "submit" }, "Write"));
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const block = name.value.trim();
      this.#act(mount, view, () => this.api.call("PUT", this.path(`/blocks/${enc(block)}`), { body: { text: text.value } }),
        `Saved ${block}.`);
    });
    return form;
  }

  #drafts(mount, view, drafts) {
    const decide = (verb, draft) => this.#act(mount, view,
      () => this.api.call("POST", this.path(`/block-drafts/${enc(draft.id)}/${verb}`), { body: {} }),
      `${verb === "approve" ? "Approved" : "Rejected"} the ${draft.change} of ${draft.name}.`);
    return table("Edits waiting", ["Block", "Change", "Proposed text", "From", "Actions"], drafts.map((draft) =>
      h("tr", { dataset: { draft: draft.id } },
        h("td", {}, draft.name),
        h("td", {}, draft.change === "replace" ? `replace “${draft.old}” with “${draft.text}”` : `append “${draft.text}”`),
        h("td", {}, h("pre", { class: "block-text" }, draft.proposed)),
        h("td", { class: "small" }, provenance(draft.provenance)),
        h("td", { class: "actions" },
          h("button", { type: "button", "aria-label": `Approve the edit of ${draft.name}: ${draft.text.slice(0, 40)}`,
            onclick: () => decide("approve", draft) }, "Approve"),
          confirmButton("Reject", "Press again to reject", () => decide("reject", draft),
            { "aria-label": `Reject the edit of ${draft.name}: ${draft.text.slice(0, 40)}` })))));
  }

  // Every version, newest first, with where it came from; any older one can be restored (as a
  // new version: history only grows).
  async #history(mount, view, info, section) {
    section.hidden = false;
    try {
      const block = await this.api.call("GET", this.path(`/blocks/${enc(info.name)}`));
      const versions = block.versions || [];
      section.replaceChildren(h("h3", { id: "block-history-title", tabindex: "-1" }, `${info.name}: history`),
        h("ol", { class: "versions", reversed: true }, versions.map((v) => h("li", { dataset: { version: String(num(v.version)) } },
          h("p", {}, `v${num(v.version)} · ${v.change === "revert" ? `revert to v${num(v.reverted_to)}` : v.change} · ${formatTime(v.created_at)} · `,
            provenance(v.provenance)),
          h("pre", { class: "block-text" }, v.text),
          num(v.version) === num(block.version) ? null
            : h("button", { type: "button", class: "secondary", "aria-label": `Revert ${info.name} to v${num(v.version)}`,
              onclick: () => this.#act(mount, view,
                () => this.api.call("POST", this.path(`/blocks/${enc(info.name)}/revert`), { body: { version: num(v.version) } }),
                `Reverted ${info.name} to the text of v${num(v.version)}.`) }, `Revert to v${num(v.version)}`)))));
      section.querySelector("h3").focus();
    } catch (error) {
      view.say(error.message);
    }
  }
}
