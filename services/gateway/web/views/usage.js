// Usage: tokens and estimated cost by day (a bar chart drawn as SVG), by model and by session,
// from GET /v1/usage (Gateway.GetUsage).

import { enc, frame, h, num, table, tokens } from "./common.js";

const SVG = "http://www.w3.org/2000/svg";
const RANGES = [["today", "Today"], ["7d", "Last 7 days"], ["30d", "Last 30 days"], ["all", "All time"]];

function svg(tag, attrs = {}, ...children) {
  const element = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) element.setAttribute(key, String(value));
  for (const child of children) element.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return element;
}

function cost(group) {
  const value = Number(group.cost || 0);
  if (!value && !group.cost_complete) return "—";
  return `$${value.toFixed(value < 1 ? 4 : 2)}${group.cost_complete ? "" : " (partial)"}`;
}

// Input and output tokens per day, stacked; each bar's <title> and the chart's label say the numbers.
function chart(days) {
  const width = 640;
  const height = 200;
  const pad = { left: 56, bottom: 28, top: 10 };
  const max = Math.max(1, ...days.map((d) => num(d.input_tokens) + num(d.output_tokens)));
  const slot = (width - pad.left) / Math.max(days.length, 1);
  const bar = Math.max(4, Math.min(48, slot * 0.6));
  const scale = (height - pad.top - pad.bottom) / max;
  const base = height - pad.bottom;
  const described = days.map((d) => `${d.key}: ${tokens(num(d.input_tokens) + num(d.output_tokens))} tokens`).join("; ");
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, class: "usage-chart", role: "img",
    "aria-label": `Tokens by day. ${described || "No model calls in this range."}` });
  root.append(svg("line", { x1: pad.left, y1: base, x2: width, y2: base, class: "axis" }));
  root.append(svg("text", { x: pad.left - 6, y: pad.top + 10, class: "tick", "text-anchor": "end" }, tokens(max)));
  root.append(svg("text", { x: pad.left - 6, y: base, class: "tick", "text-anchor": "end" }, "0"));
  days.forEach((day, index) => {
    const x = pad.left + index * slot + (slot - bar) / 2;
    const input = num(day.input_tokens) * scale;
    const output = num(day.output_tokens) * scale;
    const group = svg("g", { class: "bar" },
      svg("title", {}, `${day.key}: ${tokens(day.input_tokens)} in, ${tokens(day.output_tokens)} out, ${num(day.calls)} calls`),
      svg("rect", { x, y: base - input, width: bar, height: input, class: "bar-input" }),
      svg("rect", { x, y: base - input - output, width: bar, height: output, class: "bar-output" }));
    root.append(group);
    if (days.length <= 14 || index % Math.ceil(days.length / 14) === 0) {
      root.append(svg("text", { x: x + bar / 2, y: height - 8, class: "tick", "text-anchor": "middle" }, day.key.slice(5)));
    }
  });
  return root;
}

function groupsTable(caption, keyHeader, groups, link) {
  return table(caption, [keyHeader, "Calls", "Input tokens", "Output tokens", "Cached", "Cost"],
    groups.map((g) => h("tr", {},
      h("td", {}, link ? link(g.key) : g.key || "(none)"),
      h("td", { class: "num" }, tokens(g.calls)),
      h("td", { class: "num" }, tokens(g.input_tokens)),
      h("td", { class: "num" }, tokens(g.output_tokens)),
      h("td", { class: "num" }, tokens(g.cached_input_tokens)),
      h("td", { class: "num" }, cost(g)))));
}

export class UsageView {
  constructor(api) {
    this.api = api;
    this.range = "7d";
  }

  async show(mount) {
    const view = frame(mount, "Usage", "Tokens and estimated cost of every model call, from what the gateway recorded.");
    const select = h("select", { id: "usage-range" }, RANGES.map(([value, label]) =>
      h("option", { value, selected: value === this.range }, label)));
    select.addEventListener("change", () => {
      this.range = select.value;
      this.show(mount);
    });
    view.body.append(h("form", { class: "view-form" }, h("label", { for: "usage-range" }, "Range"), select));
    view.say("Loading usage…");
    try {
      const [days, models, sessions] = await Promise.all(["day", "model", "session"].map((group_by) =>
        this.api.call("GET", "/v1/usage", { query: { range: this.range, group_by } })));
      const total = days.total || {};
      view.say(`${tokens(total.total_tokens)} tokens in ${tokens(total.calls)} model calls · cost ${cost(total)}`);
      view.body.append(
        h("section", { class: "card", "aria-labelledby": "usage-days" },
          h("h3", { id: "usage-days" }, "Tokens by day"),
          chart(days.groups || []),
          h("p", { class: "legend small" }, h("span", { class: "swatch bar-input" }), " input ",
            h("span", { class: "swatch bar-output" }, ""), " output")),
        h("section", { class: "card", "aria-labelledby": "usage-models" },
          h("h3", { id: "usage-models" }, "By model"), groupsTable("Usage by model", "Model", models.groups || [])),
        h("section", { class: "card", "aria-labelledby": "usage-sessions" },
          h("h3", { id: "usage-sessions" }, "By session"),
          groupsTable("Usage by session", "Session", sessions.groups || [],
            (key) => h("a", { href: `#/sessions/${enc(key)}` }, key))));
    } catch (error) {
      view.say(error.message);
    }
  }
}
