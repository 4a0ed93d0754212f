// A session's workspace: browse folders, view a file (read-only), upload a file.

import { formatBytes, h } from "./dom.js";

export class WorkspaceView {
  constructor(api, elements) {
    this.api = api;
    this.el = elements; // { crumbs, files, viewerTitle, viewer, upload, uploadFile, uploadOverwrite, uploadStatus }
    this.sessionId = "";
    this.path = "";
    this.generation = 0;
    this.el.upload.addEventListener("submit", (event) => {
      event.preventDefault();
      this.upload();
    });
  }

  async open(sessionId, path = "") {
    // Only the latest open shows its listing: a slower earlier one (the session's own load, after
    // a person already went into a folder) must not put its folder back when it answers last.
    const generation = ++this.generation;
    this.sessionId = sessionId;
    this.path = path;
    this.#crumbs();
    this.el.files.replaceChildren(h("li", { class: "muted" }, "Loading…"));
    if (!sessionId) {
      this.el.files.replaceChildren(h("li", { class: "muted" }, "Start or open a session to see its workspace."));
      return;
    }
    try {
      const listing = await this.api.call("GET", `/v1/sessions/${encodeURIComponent(sessionId)}/workspace`, { query: { path } });
      if (generation !== this.generation) return;
      const items = listing.entries.map((entry) => this.#entry(entry));
      this.el.files.replaceChildren(...(items.length ? items : [h("li", { class: "muted" }, "This folder is empty.")]));
      if (listing.truncated) this.el.files.append(h("li", { class: "muted" }, "More entries than shown."));
    } catch (error) {
      if (generation !== this.generation) return;
      const text = error.code === "NOT_FOUND" ? "This session has no workspace yet." : error.message;
      this.el.files.replaceChildren(h("li", { class: "muted" }, text));
    }
  }

  #crumbs() {
    const parts = this.path ? this.path.split("/") : [];
    const crumbs = [h("button", { type: "button", class: "link", onclick: () => this.open(this.sessionId, "") }, "workspace")];
    parts.forEach((part, index) => {
      const target = parts.slice(0, index + 1).join("/");
      crumbs.push(" / ", h("button", { type: "button", class: "link", onclick: () => this.open(this.sessionId, target) }, part));
    });
    this.el.crumbs.replaceChildren(...crumbs);
  }

  #entry(entry) {
    if (entry.type === "dir") {
      return h("li", {}, h("button", { type: "button", class: "file dir", onclick: () => this.open(this.sessionId, entry.path) },
        `${entry.name}/`));
    }
    if (entry.type === "file") {
      return h("li", {}, h("button", { type: "button", class: "file", onclick: () => this.view(entry.path) },
        entry.name, h("span", { class: "muted size" }, formatBytes(entry.size))));
    }
    return h("li", { class: "muted" }, `${entry.name} (${entry.type})`);
  }

  async view(path) {
    this.el.viewerTitle.textContent = path;
    this.el.viewerTitle.classList.remove("muted");
    this.el.viewer.textContent = "Loading…";
    try {
      const file = await this.api.call("GET", `/v1/sessions/${encodeURIComponent(this.sessionId)}/workspace/file`, { query: { path } });
      const bytes = Uint8Array.from(atob(file.content), (c) => c.charCodeAt(0));
      let text;
      try {
        text = new TextDecoder("utf-8", { fatal: true }).decode(bytes);
      } catch {
        text = `(a binary file of ${formatBytes(file.size)}; not shown)`;
      }
      if (file.truncated) text += `\n\n… showing the first ${formatBytes(bytes.length)} of ${formatBytes(file.size)}`;
      this.el.viewer.textContent = text;
    } catch (error) {
      this.el.viewer.textContent = error.message;
    }
  }

  async upload() {
    const file = this.el.uploadFile.files[0];
    if (!file || !this.sessionId) return;
    const status = this.el.uploadStatus;
    status.textContent = `Uploading ${file.name}…`;
    try {
      const content = await toBase64(file);
      const path = this.path ? `${this.path}/${file.name}` : file.name;
      const written = await this.api.call("PUT", `/v1/sessions/${encodeURIComponent(this.sessionId)}/workspace/file`, {
        body: { path, content, overwrite: this.el.uploadOverwrite.checked },
      });
      status.textContent = `Uploaded ${written.path} (${formatBytes(written.size)}).`;
      this.el.upload.reset();
      await this.open(this.sessionId, this.path);
    } catch (error) {
      status.textContent = `Upload failed: ${error.message}`;
    }
  }
}

function toBase64(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(String(reader.result).split(",", 2)[1] || "");
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}
