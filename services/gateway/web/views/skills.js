// Skills of a namespace: the active ones and the drafts waiting for a person (approve or
// reject), each with its versions and files (Gateway.ListSkills, GetSkill, ApproveSkill,
// RejectSkill).

import { confirmButton, enc, formatTime, frame, h, namespaceForm, num, table } from "./common.js";

export class SkillsView {
  constructor(api) {
    this.api = api;
    this.namespace = "default";
  }

  path(suffix = "") {
    return `/v1/namespaces/${enc(this.namespace)}/skills${suffix}`;
  }

  async show(mount) {
    const view = frame(mount, "Skills", "What the agent can load by name. Drafts (from reflection or --draft) wait for a person.");
    const detail = h("section", { class: "card skill-detail", "aria-labelledby": "skill-detail-title", hidden: true });
    const list = h("div", {});
    view.body.append(namespaceForm("skills", this.namespace, (ns) => { this.namespace = ns; this.show(mount); }), list, detail);
    view.say("Loading skills…");
    try {
      const reply = await this.api.call("GET", this.path(), { query: { include_drafts: true } });
      const skills = reply.skills || [];
      const drafts = skills.filter((s) => s.status === "draft").length;
      view.say(`${skills.length - drafts} active, ${drafts} draft${drafts === 1 ? "" : "s"} waiting in ${this.namespace}`);
      if (!skills.length) {
        list.append(h("p", { class: "muted" }, "No skills in this namespace."));
        return;
      }
      const decided = async (verb, skill) => {
        try {
          await this.api.call("POST", this.path(`/${enc(skill.name)}/${verb}`), { body: {} });
          await this.show(mount);
          mount.querySelector(".view-status").textContent =
            `${verb === "approve" ? "Approved" : "Rejected"} ${skill.name} v${skill.version}. ` + mount.querySelector(".view-status").textContent;
        } catch (error) {
          view.say(error.message);
        }
      };
      list.append(table("Skills", ["Name", "Version", "Status", "Description", "Source", "Actions"], skills.map((skill) =>
        h("tr", { dataset: { skill: skill.name, status: skill.status } },
          h("td", {}, skill.name),
          h("td", { class: "num" }, `v${num(skill.version)}`),
          h("td", {}, h("span", { class: `state state-${skill.status}` }, skill.status)),
          h("td", {}, skill.description),
          h("td", { class: "small" }, skill.source || ""),
          h("td", { class: "actions" },
            h("button", { type: "button", class: "secondary", "aria-label": `Versions of ${skill.name}`,
              onclick: () => this.#detail(detail, skill, Math.max(...skills.filter((s) => s.name === skill.name).map((s) => num(s.version)))) },
            "Versions"),
            skill.status === "draft"
              ? [h("button", { type: "button", "aria-label": `Approve ${skill.name} v${num(skill.version)}`,
                  onclick: () => decided("approve", skill) }, "Approve"),
                confirmButton("Reject", "Press again to reject", () => decided("reject", skill),
                  { "aria-label": `Reject ${skill.name} v${num(skill.version)}` })]
              : null)))));
    } catch (error) {
      view.say(error.message);
    }
  }

  // Every version still stored, newest first, and the chosen one's SKILL.md and files.
  async #detail(section, info, latest) {
    section.hidden = false;
    const body = h("pre", { class: "skill-body", tabindex: "0", "aria-label": "SKILL.md" });
    const files = h("ul", { class: "small" });
    const versions = h("ol", { class: "versions", reversed: true });
    section.replaceChildren(h("h3", { id: "skill-detail-title" }, `${info.name}: versions`), versions,
      h("h4", {}, "Files"), files, h("h4", {}, "SKILL.md"), body);
    const open = async (version) => {
      const skill = await this.api.call("GET", this.path(`/${enc(info.name)}`), { query: { version } });
      body.textContent = skill.body;
      files.replaceChildren(...(skill.files || []).map((f) => h("li", {}, h("code", {}, f.path))));
      for (const button of versions.querySelectorAll("button")) {
        button.setAttribute("aria-pressed", String(button.dataset.version === String(num(skill.info.version))));
      }
    };
    for (let version = latest; version >= 1; version -= 1) {
      try {
        const skill = await this.api.call("GET", this.path(`/${enc(info.name)}`), { query: { version } });
        const v = skill.info;
        versions.append(h("li", {}, h("button", { type: "button", class: "link", dataset: { version: String(num(v.version)) },
          onclick: () => open(num(v.version)) }, `v${num(v.version)}`),
        ` · ${v.status} · ${formatTime(v.created_at)}${v.source ? ` · ${v.source}` : ""}`));
      } catch (error) {
        if (error.code !== "NOT_FOUND") throw error;
      }
    }
    await open(num(info.version));
    section.querySelector("h3").setAttribute("tabindex", "-1");
    section.querySelector("h3").focus();
  }
}
