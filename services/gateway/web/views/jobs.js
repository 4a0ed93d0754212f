// Scheduled jobs: create one, pause or resume it, run it now, read its run history (the
// Scheduler's HTTP routes under /v1/cron).

import { confirmButton, duration, enc, formatTime, frame, h, sessionLink, table } from "./common.js";

function field(id, label, attrs = {}) {
  return [h("label", { for: id }, label), h("input", { id, name: id, autocomplete: "off", ...attrs })];
}

export class JobsView {
  constructor(api) {
    this.api = api;
  }

  async show(mount, { message = "" } = {}) {
    const view = frame(mount, "Scheduled jobs", "Runs the scheduler starts on a timetable; each goes through the gateway like a user's turn.");
    const history = h("section", { class: "card", "aria-labelledby": "job-history-title", hidden: true });
    const list = h("div", {});
    view.body.append(this.#createForm(mount, view), list, history);
    view.say("Loading jobs…");
    try {
      const reply = await this.api.call("GET", "/v1/cron/jobs");
      const jobs = reply.jobs || [];
      view.say(`${message}${jobs.length} job${jobs.length === 1 ? "" : "s"}`);
      if (!jobs.length) {
        list.append(h("p", { class: "muted" }, "No jobs yet: create one above."));
        return;
      }
      const act = async (job, path, done) => {
        try {
          const result = await this.api.call("POST", `/v1/cron/jobs/${enc(job.job_id)}/${path}`, { body: {} });
          await this.show(mount, { message: `${done(result)} · ` });
        } catch (error) {
          view.say(error.message);
        }
      };
      list.append(table("Jobs", ["Name", "Schedule", "State", "Next run", "Last run", "Actions"], jobs.map((job) => {
        const enabled = job.enabled !== false;
        return h("tr", { dataset: { job: job.job_id } },
          h("td", {}, job.name || job.job_id, h("div", { class: "muted small" }, job.prompt)),
          h("td", {}, h("code", {}, job.schedule || (job.run_at ? `once at ${formatTime(job.run_at)}` : ""))),
          h("td", {}, h("span", { class: `state state-${enabled ? "enabled" : "paused"}` }, job.done_at ? "done" : enabled ? "enabled" : "paused")),
          h("td", {}, formatTime(job.next_run_at)),
          h("td", {}, formatTime(job.last_run_at)),
          h("td", { class: "actions" },
            h("button", { type: "button", class: "secondary", "aria-label": `${enabled ? "Pause" : "Resume"} ${job.name || job.job_id}`,
              onclick: () => act(job, "toggle", (j) => `${j.name || j.job_id} ${j.enabled === false ? "paused" : "resumed"}`) },
            enabled ? "Pause" : "Resume"),
            h("button", { type: "button", "aria-label": `Run ${job.name || job.job_id} now`,
              onclick: () => act(job, "trigger", (run) => `Started run ${run.run_id}`) }, "Run now"),
            h("button", { type: "button", class: "secondary", "aria-label": `History of ${job.name || job.job_id}`,
              onclick: () => this.#history(history, job) }, "History"),
            job.source ? null : confirmButton("Delete", "Press again to delete", async () => {
              try {
                await this.api.call("DELETE", `/v1/cron/jobs/${enc(job.job_id)}`);
                await this.show(mount, { message: `Deleted ${job.name || job.job_id} · ` });
              } catch (error) {
                view.say(error.message);
              }
            }, { "aria-label": `Delete ${job.name || job.job_id}` })));
      })));
    } catch (error) {
      view.say(error.message);
    }
  }

  #createForm(mount, view) {
    const form = h("form", { class: "card job-form", "aria-labelledby": "job-create-title" },
      h("h3", { id: "job-create-title" }, "New job"),
      h("div", { class: "grid-form" },
        ...field("job-name", "Name", { required: true }),
        ...field("job-schedule", "Schedule", { required: true, placeholder: "daily 09:00, every 30m, */5 * * * *" }),
        ...field("job-session", "Session (empty: a new one per run)"),
        h("label", { for: "job-prompt" }, "Prompt"),
        h("textarea", { id: "job-prompt", name: "job-prompt", rows: 2, required: true })),
      h("button", { type: "submit" }, "Create job"));
    form.addEventListener("submit", async (event) => {
      event.preventDefault();
      const value = (id) => form.querySelector(`#${id}`).value.trim();
      try {
        const job = await this.api.call("POST", "/v1/cron/jobs", { body: { job: {
          name: value("job-name"), schedule: value("job-schedule"), prompt: value("job-prompt"), session_id: value("job-session"),
        } } });
        await this.show(mount, { message: `Created ${job.name} · ` });
      } catch (error) {
        view.say(error.message);
      }
    });
    return form;
  }

  async #history(section, job) {
    section.hidden = false;
    section.replaceChildren(h("h3", { id: "job-history-title", tabindex: "-1" }, `Runs of ${job.name || job.job_id}`));
    try {
      const reply = await this.api.call("GET", `/v1/cron/jobs/${enc(job.job_id)}/runs`, { query: { limit: 50 } });
      const runs = reply.runs || [];
      section.append(runs.length
        ? table(`Runs of ${job.name || job.job_id}`, ["Started", "Trigger", "Status", "Took", "Session", "Summary"], runs.map((run) =>
          h("tr", {},
            h("td", {}, formatTime(run.started_at || run.scheduled_for)),
            h("td", {}, run.trigger),
            h("td", {}, h("span", { class: `state state-${run.status}` }, run.status)),
            h("td", { class: "num" }, duration(run.finished_at ? run.finished_at - run.started_at : 0)),
            h("td", {}, run.session_id ? sessionLink(run.session_id) : ""),
            h("td", { class: "small" }, run.error || run.summary || ""))))
        : h("p", { class: "muted" }, "No runs yet."));
    } catch (error) {
      section.append(h("p", { class: "error" }, error.message));
    }
    section.querySelector("h3").focus();
  }
}
