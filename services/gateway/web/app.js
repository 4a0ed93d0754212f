// The agentmesh web console: sign-in, sessions, chat, workspace and traces over the HTTP API.

import { Api, ApiError } from "./api.js";
import { Conversation } from "./chat.js";
import { DevPanel } from "./devpanel.js";
import { formatTime, h } from "./dom.js";
import { ImageTray } from "./images.js";
import { SessionControls } from "./session_controls.js";
import { TeamPanel } from "./team.js";
import { TraceView } from "./trace.js";
import { Views } from "./views/index.js";
import { WorkspaceView } from "./workspace.js";

const $ = (id) => document.getElementById(id);
const api = new Api();
// `generation` counts session opens: work of an open that a newer one overtook is dropped.
const state = { sessionId: "", sessions: [], running: false, streams: 0, commandTools: new Set(), generation: 0, awayInView: false };

const conversation = new Conversation($("log"), {
  approve: (callId, decision) => api.approve(state.sessionId, callId, decision),
  showTrace: (traceId) => {
    selectTab("trace");
    traces.show(traceId);
  },
  openSession: (id) => navigate(id),
  runsCode: (name) => state.commandTools.has(name),
  fork: async (seq) => {
    const forked = await api.fork(state.sessionId, seq);
    await loadSessions();
    navigate(forked.session.session_id);
  },
  contextFill: (tokens, window) => controls.contextFill(tokens, window),
  imageUrl: (image) => storedImage(state.sessionId, image),
  messageLink: (seq) => `#/sessions/${encodeURIComponent(state.sessionId)}/messages/${seq}`,
  latestPlan: async (afterSeq) => {
    const messages = await transcript(state.sessionId, afterSeq);
    const plans = messages.filter((m) => m.role === "assistant" && /^(Plan:|Revised plan)/.test(m.content || ""));
    return plans.length ? plans[plans.length - 1].content : "";
  },
});
// A stored image (a tool result's, by its `.attachments/` path) as a data URL, fetched once: the
// path names the bytes' hash, so a session's figure shown again (a reload, the windowed log) is
// not fetched again. "" when the workspace view cut it (larger than AGENTMESH_TOOLS_MAX_VIEW_BYTES).
const imageUrls = new Map();
function storedImage(sessionId, image) {
  const key = `${sessionId}\n${image.path}`;
  if (!imageUrls.has(key)) {
    if (imageUrls.size >= 200) imageUrls.delete(imageUrls.keys().next().value);
    const path = `/v1/sessions/${encodeURIComponent(sessionId)}/workspace/file`;
    imageUrls.set(key, api.call("GET", path, { query: { path: image.path } }).then(
      (file) => (file.truncated ? "" : `data:${image.media_type || "image/png"};base64,${file.content}`),
      (error) => {
        imageUrls.delete(key);
        throw error;
      }));
  }
  return imageUrls.get(key);
}

const controls = new SessionControls(api, { agent: $("agent-picker"), model: $("model-picker"), permissionMode: $("permission-mode"),
  plan: $("plan-mode"), deep: $("deep-mode"), ifBusy: $("if-busy"), busyRow: $("busy-row"), busyHint: $("busy-hint"),
  contextFill: $("context-fill"), status: $("controls-status") });
const tray = new ImageTray({ tray: $("attachments"), input: $("image-file"), message: $("message"),
  composer: $("composer"), status: $("turn-state") });
const workspace = new WorkspaceView(api, {
  crumbs: $("crumbs"), files: $("files"), viewerTitle: $("viewer-title"), viewer: $("viewer"),
  upload: $("upload"), uploadFile: $("upload-file"), uploadOverwrite: $("upload-overwrite"), uploadStatus: $("upload-status"),
});
// A lead session's teammates, kept live by its stream's teammate_status events (team.js).
const team = new TeamPanel(api, $("team"), { openSession: (id) => navigate(id) });
const traces = new TraceView(api, { form: $("trace-form"), input: $("trace-id"), status: $("trace-status"), waterfall: $("waterfall") });
// The views over what is stored (#/usage, #/skills, …) and the dev panel (#/dev): views/index.js.
const devpanel = new DevPanel(api, { sessions: () => state.sessions });
const views = new Views(api, {
  mount: $("view"), nav: $("views-nav"), devpanel, sessions: () => state.sessions,
  showTrace: (sessionId, traceId) => {
    navigate(sessionId);
    selectTab("trace");
    traces.show(traceId);
  },
});

// --- signing in -----------------------------------------------------------------------------

function showSignIn(message = "") {
  $("app").hidden = true;
  $("views-nav").hidden = true;
  $("sign-out").hidden = true;
  $("signin").hidden = false;
  $("signin-error").textContent = message;
  $("token").focus();
}

async function loadTools() {
  // Which tools run programs, so their cards show an exit status.
  const reply = await api.call("GET", "/v1/tools");
  state.commandTools = new Set(reply.tools.filter((tool) => tool.runs_code).map((tool) => tool.name));
}

async function showApp() {
  loadTools().catch(() => {});
  controls.loadModels().catch(() => {});
  controls.loadAgents().catch(() => {});
  $("signin").hidden = true;
  $("app").hidden = false;
  $("sign-out").hidden = !api.token;
  $("views-nav").hidden = false;
  await route();
}

$("signin-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  api.setToken($("token").value.trim());
  try {
    await loadSessions();
    $("token").value = "";
    await showApp();
  } catch (error) {
    api.setToken("");
    showSignIn(error.status === 401 ? "That token was not accepted." : error.message);
  }
});

$("sign-out").addEventListener("click", () => {
  api.setToken("");
  conversation.clear();
  showSignIn();
});

// --- sessions -------------------------------------------------------------------------------

async function loadSessions() {
  const reply = await api.call("GET", "/v1/sessions", { query: { page_size: 500 } });
  state.sessions = reply.sessions.sort((a, b) => b.updated_at - a.updated_at);
  renderSessions();
}

function childrenOf(sessionId) {
  return state.sessions.filter((s) => (s.labels || {}).parent_session === sessionId);
}

function renderSessions() {
  const list = $("session-list");
  const item = (session) => {
    const children = childrenOf(session.session_id);
    return h("li", {},
      h("button", {
        type: "button",
        class: "session",
        "aria-current": session.session_id === state.sessionId ? "page" : false,
        onclick: () => navigate(session.session_id),
      },
      h("span", { class: "session-name" }, session.title || session.session_id),
      h("span", { class: "muted small" }, `${session.message_count} messages · ${formatTime(session.updated_at)}`)),
      children.length ? h("ul", { class: "children", "aria-label": "Sub-agent sessions" }, children.map(item)) : null);
  };
  const top = state.sessions.filter((s) => !(s.labels || {}).parent_session || !state.sessions.some((p) => p.session_id === s.labels.parent_session));
  list.replaceChildren(...top.map(item));
  $("sessions-empty").hidden = state.sessions.length > 0;
}

function navigate(sessionId) {
  closeSidebarOnNarrowScreens(); // a session was picked: show it
  const target = sessionId ? `#/sessions/${encodeURIComponent(sessionId)}` : "#/";
  if (location.hash === target) route();
  else location.hash = target;
}

// #/sessions/ID opens a session; #/sessions/ID/messages/SEQ opens it at that message.
async function route() {
  const inView = views.route(location.hash);
  $("main").hidden = inView;
  const away = state.awayInView;
  state.awayInView = inView;
  if (inView) return;
  const match = /^#\/sessions\/([^/]+)(?:\/messages\/(\d+))?$/.exec(location.hash);
  const sessionId = match ? decodeURIComponent(match[1]) : "";
  const seq = match && match[2] ? Number(match[2]) : 0;
  if (seq && sessionId === state.sessionId && conversation.reveal(seq)) return;
  // Back from a view to the session still open (its running turn still drawing): nothing to reload.
  if (away && sessionId && sessionId === state.sessionId) return;
  await openSession(sessionId);
  if (seq && sessionId === state.sessionId) conversation.reveal(seq);
}

async function openSession(sessionId, { attach = true } = {}) {
  const generation = ++state.generation;
  state.sessionId = sessionId;
  $("nav-chat").href = sessionId ? `#/sessions/${encodeURIComponent(sessionId)}` : "#/";
  renderSessions();
  conversation.clear();
  $("subagents").hidden = true;
  $("delete-session").hidden = !sessionId;
  resetDelete();
  controls.show(null);
  team.open("");
  if (!sessionId) {
    $("session-title").textContent = "New conversation";
    $("session-meta").textContent = "Send a message to start a session.";
    workspace.open("");
    return;
  }
  $("session-title").textContent = sessionId;
  try {
    const session = await api.call("GET", `/v1/sessions/${encodeURIComponent(sessionId)}`);
    if (generation !== state.generation) return;
    $("session-title").textContent = session.title || session.session_id;
    controls.show(session);
    team.open(sessionId); // a lead's teammates, once the session is known to exist
    showMeta(session);
    renderRelatives(session);
    const messages = await transcript(sessionId);
    if (generation !== state.generation) return;
    conversation.renderHistory(messages);
    if (attach) attachRunningTurn(sessionId, messages, generation);
  } catch (error) {
    if (error.status === 401) return showSignIn("Your token is no longer accepted.");
    $("session-meta").textContent = error.code === "NOT_FOUND" ? "This session does not exist (yet): send a message to start it." : error.message;
  }
  // The same session's folder stays (a person may have gone into one while the session loaded).
  if (!$("panel-workspace").hidden) workspace.open(sessionId, workspace.sessionId === sessionId ? workspace.path : "");
}

function showMeta(session) {
  $("session-meta").textContent = `${session.session_id} · ${session.message_count} messages · memory: ${session.namespace} · started ${formatTime(session.created_at)}`;
}

function renderRelatives(session) {
  const links = [];
  const forkOf = (session.labels || {})["agentmesh.fork.of"];
  if (forkOf) {
    links.push("Forked from ", h("button", { type: "button", class: "link", onclick: () => navigate(forkOf) }, forkOf),
      ` at message ${session.labels["agentmesh.fork.at"]}. `);
  }
  const parent = (session.labels || {}).parent_session;
  if (parent) {
    links.push("Sub-agent of ", h("button", { type: "button", class: "link", onclick: () => navigate(parent) }, parent), ". ");
  }
  const children = childrenOf(session.session_id);
  if (children.length) {
    links.push("Sub-agents: ");
    children.forEach((child, index) => {
      if (index) links.push(", ");
      links.push(h("button", { type: "button", class: "link", onclick: () => navigate(child.session_id) }, child.title || child.session_id));
    });
  }
  $("subagents").replaceChildren(...links);
  $("subagents").hidden = links.length === 0;
}

async function transcript(sessionId, from = 0) {
  const messages = [];
  let after = from;
  for (;;) {
    const page = await api.call("GET", `/v1/sessions/${encodeURIComponent(sessionId)}/transcript`, { query: { after_seq: after, page_size: 1000 } });
    messages.push(...page.messages);
    if (!Number(page.next_after_seq)) return messages;
    after = page.next_after_seq;
  }
}

$("new-session").addEventListener("click", () => {
  navigate("");
  $("message").focus();
});

function resetDelete() {
  const button = $("delete-session");
  button.textContent = "Delete session";
  button.dataset.armed = "";
}

$("delete-session").addEventListener("click", async () => {
  const button = $("delete-session");
  if (!button.dataset.armed) {
    // Two presses, so a stray click or key never deletes a conversation.
    button.dataset.armed = "yes";
    button.textContent = "Press again to delete";
    return;
  }
  try {
    await api.call("DELETE", `/v1/sessions/${encodeURIComponent(state.sessionId)}`);
    await loadSessions();
    navigate("");
  } catch (error) {
    $("session-meta").textContent = error.message;
    resetDelete();
  }
});
$("delete-session").addEventListener("blur", resetDelete);

// --- a turn ---------------------------------------------------------------------------------

// Send stays enabled while a turn runs: a message then goes with the chosen if_busy.
function setRunning(running, text = "") {
  state.running = running;
  $("cancel-turn").hidden = !running;
  $("turn-state").textContent = text;
  controls.running(running);
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});

$("message").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});

$("cancel-turn").addEventListener("click", async () => {
  $("turn-state").textContent = "Cancelling…";
  try {
    await api.call("POST", `/v1/sessions/${encodeURIComponent(state.sessionId)}/cancel`, { body: {} });
  } catch (error) {
    $("turn-state").textContent = error.message;
  }
});

async function send() {
  const text = $("message").value.trim();
  if (!text && !tray.count) return;
  const busy = state.running && state.streams > 0;
  if (!state.sessionId) {
    try {
      const session = await api.call("POST", "/v1/sessions", { body: { title: (text || "images").slice(0, 60) } });
      state.sessionId = session.session_id;
      team.open(session.session_id);
      $("nav-chat").href = `#/sessions/${encodeURIComponent(session.session_id)}`;
      history.replaceState(null, "", `#/sessions/${encodeURIComponent(session.session_id)}`);
      $("session-title").textContent = session.title;
      $("delete-session").hidden = false;
      await controls.created(session.session_id);
    } catch (error) {
      $("turn-state").textContent = error.message;
      return;
    }
  }
  $("message").value = "";
  const images = tray.take();
  const body = { message: text, options: controls.options(busy),
                 images: images.map((i) => ({ data: i.data, media_type: i.type, name: i.name })) };
  const sessionId = state.sessionId;
  const replayed = await follow(sessionId, conversation.startTurn(text, images), body, "");
  if (replayed && state.sessionId === sessionId) await openSession(sessionId);
}

// Read a turn's events into `turn`: a new turn (no lastEventId), or one already running.
// A dropped connection is picked up again with Last-Event-ID: the turn goes on at the gateway.
// Returns whether transcript entries came instead of live events (the gateway had no live feed).
async function follow(sessionId, turn, body, lastEventId) {
  state.streams += 1;
  setRunning(true, "The agent is working…");
  let replayed = false;
  for (let attempt = 0; ; attempt += 1) {
    try {
      for await (const message of api.chat(sessionId, body, { lastEventId })) {
        lastEventId = message.id;
        devpanel.record(sessionId, message);
        if (message.event === "teammate_status") team.event(sessionId, message.data.teammate_status);
        if (message.event === "message") replayed = true; // resumed from the transcript
        else turn.handle(message.event, message.data, message.id);
      }
      break;
    } catch (error) {
      if (error instanceof ApiError) {
        turn.handle("error", { error: { code: error.code, message: error.message } });
        break;
      }
      if (!lastEventId || attempt >= 3) {
        turn.handle("error", { error: { code: "UNAVAILABLE", message: `the connection to the gateway was lost (${error.message})` } });
        break;
      }
      $("turn-state").textContent = "Reconnecting…";
      await new Promise((resolve) => setTimeout(resolve, 500 * (attempt + 1)));
    }
  }
  state.streams -= 1;
  setRunning(state.streams > 0, state.streams > 0 ? "The agent is working…" : "");
  await loadSessions().catch(() => {});
  const current = state.sessions.find((s) => s.session_id === sessionId);
  if (current && state.sessionId === sessionId) showMeta(current);
  return replayed;
}

// Opening a session whose turn is running (a reload, another tab): follow that turn live.
async function attachRunningTurn(sessionId, messages, generation) {
  if (state.running) return;
  let running;
  try {
    running = await api.call("GET", `/v1/sessions/${encodeURIComponent(sessionId)}/approvals`);
  } catch {
    return;
  }
  if (!running.run_id || generation !== state.generation || state.running) return;
  const own = messages.filter((m) => m.run_id === running.run_id);
  const base = own.length ? Number(own[0].seq) - 1 : messages.length ? Number(messages[messages.length - 1].seq) : 0;
  // The turn's events from its start replace what the transcript holds of it so far.
  conversation.clear();
  conversation.renderHistory(messages.filter((m) => m.run_id !== running.run_id));
  const first = own.find((m) => m.role === "user");
  const turn = conversation.startTurn(first ? first.content : "");
  const replayed = await follow(sessionId, turn, {}, `${base}.0`);
  if (replayed && state.sessionId === sessionId) {
    // Not started through this gateway: no live events here, only what is saved so far.
    await openSession(sessionId, { attach: false });
  }
}

// --- tabs and layout ------------------------------------------------------------------------

const TABS = ["chat", "workspace", "trace"];

function selectTab(name) {
  for (const tab of TABS) {
    const selected = tab === name;
    $(`tab-${tab}`).setAttribute("aria-selected", String(selected));
    $(`tab-${tab}`).tabIndex = selected ? 0 : -1;
    $(`panel-${tab}`).hidden = !selected;
  }
  if (name === "workspace") workspace.open(state.sessionId, workspace.sessionId === state.sessionId ? workspace.path : "");
}

for (const tab of TABS) {
  $(`tab-${tab}`).addEventListener("click", () => selectTab(tab));
  $(`tab-${tab}`).addEventListener("keydown", (event) => {
    const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
    if (!step) return;
    const next = TABS[(TABS.indexOf(tab) + step + TABS.length) % TABS.length];
    selectTab(next);
    $(`tab-${next}`).focus();
  });
}

$("toggle-sessions").addEventListener("click", () => {
  const open = !$("sidebar").classList.contains("open");
  $("sidebar").classList.toggle("open", open);
  $("toggle-sessions").setAttribute("aria-expanded", String(open));
});

function closeSidebarOnNarrowScreens() {
  $("sidebar").classList.remove("open");
  $("toggle-sessions").setAttribute("aria-expanded", "false");
}

window.addEventListener("hashchange", route);

// --- start ----------------------------------------------------------------------------------

(async () => {
  try {
    await loadSessions();
    await showApp();
  } catch (error) {
    if (error.status === 401) showSignIn(api.token ? "Your token is no longer accepted." : "");
    else {
      $("connection").textContent = `The gateway did not answer: ${error.message}`;
    }
  }
})();
