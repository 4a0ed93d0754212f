// A turn's trace as a waterfall, from the gateway's local span store (GET /v1/traces/{id}).

import { formatMs, h } from "./dom.js";

const SPANS_FLUSH_WAIT_MS = 15000;

export class TraceView {
  constructor(api, elements) {
    this.api = api;
    this.el = elements; // { form, input, status, waterfall }
    this.el.form.addEventListener("submit", (event) => {
      event.preventDefault();
      this.show(this.el.input.value.trim());
    });
  }

  async show(traceId) {
    if (!traceId) return;
    this.el.input.value = traceId;
    this.el.waterfall.replaceChildren();
    this.el.status.textContent = "Loading the trace…";
    const deadline = Date.now() + SPANS_FLUSH_WAIT_MS;
    for (;;) {
      try {
        const trace = await this.api.call("GET", `/v1/traces/${encodeURIComponent(traceId)}`);
        // Spans are written a moment after they end; the turn's root is among the last.
        if (trace.spans.some((span) => span.depth === 0 && !span.orphan) || Date.now() > deadline) {
          this.#draw(trace);
          return;
        }
      } catch (error) {
        if (error.code !== "NOT_FOUND" || Date.now() > deadline) {
          this.el.status.textContent = error.message;
          return;
        }
      }
      this.el.status.textContent = "Waiting for the services to write the spans…";
      await new Promise((resolve) => setTimeout(resolve, 700));
    }
  }

  #draw(trace) {
    const total = Math.max(trace.end - trace.start, 1e-6);
    const services = [...new Set(trace.spans.map((s) => s.service))];
    this.el.status.textContent = `${trace.spans.length} spans · ${formatMs(total * 1000)} · ${services.join(", ")}`;
    // The turn's run (its agent span says which): its every event in the dev panel.
    const run = trace.spans.map((s) => (s.attributes || {})["agentmesh.run_id"]).find(Boolean);
    const rows = trace.spans.map((span) => {
      const left = ((span.start - trace.start) / total) * 100;
      const width = Math.max(((span.end - span.start) / total) * 100, 0.3);
      const duration = formatMs((span.end - span.start) * 1000);
      const service = span.service.replace(/^agentmesh-/, "");
      return h("div", { class: `span-row${span.status === "ERROR" ? " failed" : ""}`, role: "row" },
        h("div", { class: "span-name", role: "cell", style: { paddingLeft: `${span.depth * 0.9}rem` }, title: span.name },
          span.name, span.orphan ? h("span", { class: "muted" }, " (parent missing)") : null,
          // A model call's request and response, when recorded: with the run's in the dev panel.
          run && span.name.startsWith("chat ") ? h("a", { href: `#/dev/${encodeURIComponent(run)}`, class: "trace-model-call small" },
            " request and response") : null),
        h("div", { class: "span-service", role: "cell" }, service),
        h("div", { class: "span-track", role: "cell", "aria-label": `${duration}, starting at ${formatMs((span.start - trace.start) * 1000)}` },
          h("div", { class: `span-bar svc-${service}`, style: { left: `${left}%`, width: `${width}%` } })),
        h("div", { class: "span-duration", role: "cell" }, duration));
    });
    const events = run ? h("p", { class: "small" }, h("a", { href: `#/dev/${encodeURIComponent(run)}`, class: "trace-events" },
      `Every event of ${run} in the dev panel`)) : null;
    this.el.waterfall.replaceChildren(...[events, h("div", { role: "table", "aria-label": `Trace ${trace.trace_id}` }, rows)].filter(Boolean));
  }
}
