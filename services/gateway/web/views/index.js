// The console's views over what the platform stores, each at its own hash route so it can be
// linked to: #/usage, #/activity, #/skills, #/memory, #/blocks, #/jobs, #/tasks[/SESSION], #/dev.

import { ActivityView } from "./activity.js";
import { BlocksView } from "./blocks.js";
import { JobsView } from "./jobs.js";
import { MemoryView } from "./memory.js";
import { SkillsView } from "./skills.js";
import { TasksView } from "./tasks.js";
import { UsageView } from "./usage.js";

export const VIEW_ROUTES = ["usage", "activity", "skills", "memory", "blocks", "jobs", "tasks", "dev"];

export class Views {
  constructor(api, { mount, nav, devpanel, sessions, showTrace }) {
    this.mount = mount;
    this.nav = nav;
    this.views = {
      usage: new UsageView(api),
      activity: new ActivityView(api, { showTrace }),
      skills: new SkillsView(api),
      memory: new MemoryView(api),
      blocks: new BlocksView(api),
      jobs: new JobsView(api),
      tasks: new TasksView(api, { sessions }),
      dev: devpanel,
    };
    this.current = "";
  }

  // Shows the view `hash` names and returns true; false (and nothing shown) for the chat's routes.
  route(hash) {
    const match = /^#\/([a-z]+)(?:\/(.*))?$/.exec(hash);
    const name = match && VIEW_ROUTES.includes(match[1]) ? match[1] : "";
    if (this.current && this.current !== name) this.views[this.current].hide?.();
    this.current = name;
    for (const link of this.nav.querySelectorAll("a")) {
      const target = /^#\/([a-z]*)/.exec(link.getAttribute("href"))[1];
      const chat = link.id === "nav-chat";
      link.setAttribute("aria-current", (chat ? !name : target === name) ? "page" : "false");
    }
    this.mount.hidden = !name;
    if (!name) return false;
    this.views[name].show(this.mount, match[2] ? decodeURIComponent(match[2]) : "");
    this.mount.querySelector("h2")?.focus();
    return true;
  }
}
