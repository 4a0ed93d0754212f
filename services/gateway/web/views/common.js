// What the views share: a view's frame (heading, status line), tables, a namespace form, a
// Server-Sent Events reader for GET streams, and two-press confirmation for what cannot be undone.

import { parseEventStream } from "../api.js";
import { formatTime, h } from "../dom.js";

export { formatTime, h };

export const enc = encodeURIComponent;
export const num = (value) => Number(value || 0);
export const tokens = (value) => num(value).toLocaleString("en");

// The frame every view draws into: an h2 the view is named by, a status line, the body.
export function frame(mount, title, intro) {
  const status = h("p", { class: "muted view-status", role: "status" });
  const body = h("div", { class: "view-body" });
  mount.replaceChildren(
    h("div", { class: "view-head" }, h("h2", { id: "view-title", tabindex: "-1" }, title),
      intro ? h("p", { class: "muted" }, intro) : null),
    status, body);
  mount.setAttribute("aria-labelledby", "view-title");
  return { status, body, say: (text) => { status.textContent = text; } };
}

// A table with a caption (its accessible name) and one header row.
export function table(caption, headers, rows, { className = "data" } = {}) {
  return h("table", { class: className },
    h("caption", { class: "visually-hidden" }, caption),
    h("thead", {}, h("tr", {}, headers.map((text) => h("th", { scope: "col" }, text)))),
    h("tbody", {}, rows));
}

// "Namespace [default] Show": the views over a namespace's records. `key` keeps labels unique.
export function namespaceForm(key, value, onSubmit, ...extra) {
  const input = h("input", { id: `${key}-namespace`, name: "namespace", value, autocomplete: "off", spellcheck: "false" });
  const form = h("form", { class: "view-form" },
    h("label", { for: `${key}-namespace` }, "Namespace"), input, ...extra,
    h("button", { type: "submit" }, "Show"));
  form.addEventListener("submit", (event) => {
    event.preventDefault();
    onSubmit(input.value.trim() || "default");
  });
  return form;
}

// A button that asks for a second press before `action` (a stray click or key never forgets,
// rejects or deletes anything); leaving it disarms it.
export function confirmButton(label, armedLabel, action, attrs = {}) {
  const button = h("button", { type: "button", class: "danger", ...attrs }, label);
  button.addEventListener("click", async () => {
    if (!button.dataset.armed) {
      button.dataset.armed = "yes";
      button.textContent = armedLabel;
      return;
    }
    button.disabled = true;
    try {
      await action();
    } finally {
      button.disabled = false;
      button.dataset.armed = "";
      button.textContent = label;
    }
  });
  button.addEventListener("blur", () => {
    button.dataset.armed = "";
    button.textContent = label;
  });
  return button;
}

// Yields {event, data} of a GET stream (WatchActivity) until `signal` aborts it.
export async function* streamGet(api, path, signal) {
  const response = await fetch(path, { headers: api.headers({ Accept: "text/event-stream" }), signal });
  if (!response.ok) {
    let message = response.statusText;
    try {
      message = (await response.json()).error.message;
    } catch {
      // not JSON: the status text says it
    }
    throw new Error(message);
  }
  yield* parseEventStream(response.body);
}

export function sessionLink(sessionId) {
  return h("a", { href: `#/sessions/${enc(sessionId)}` }, sessionId);
}

export function duration(seconds) {
  if (!seconds || seconds < 0) return "";
  return seconds < 60 ? `${seconds.toFixed(1)} s` : `${Math.floor(seconds / 60)} min ${Math.round(seconds % 60)} s`;
}
