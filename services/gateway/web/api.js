// The gateway's HTTP API (docs/api.md): JSON calls, and chat as Server-Sent Events read from a
// fetch stream (EventSource cannot POST or send a bearer token).

const TOKEN_KEY = "agentmesh.token";

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

export class Api {
  constructor() {
    this.token = sessionStorage.getItem(TOKEN_KEY) || "";
  }

  setToken(token) {
    this.token = token;
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  }

  headers(extra = {}) {
    const headers = { ...extra };
    if (this.token) headers.Authorization = `Bearer ${this.token}`;
    return headers;
  }

  async call(method, path, { body, query } = {}) {
    let url = path;
    if (query) {
      const params = new URLSearchParams();
      for (const [key, value] of Object.entries(query)) {
        if (value !== undefined && value !== null && value !== "") params.append(key, value);
      }
      const text = params.toString();
      if (text) url += `?${text}`;
    }
    const response = await fetch(url, {
      method,
      headers: this.headers(body === undefined ? {} : { "Content-Type": "application/json" }),
      body: body === undefined ? undefined : JSON.stringify(body),
    });
    return this.#json(response);
  }

  async #json(response) {
    let payload = null;
    try {
      payload = await response.json();
    } catch {
      payload = null;
    }
    if (!response.ok) {
      const error = payload && payload.error ? payload.error : { code: "UNKNOWN", message: response.statusText };
      throw new ApiError(response.status, error.code, error.message);
    }
    return payload;
  }

  // A decision on a held call: {approved, note, rest_of_turn, arguments_json} (docs/approvals.md).
  approve(sessionId, callId, decision) {
    return this.call("POST", `/v1/sessions/${encodeURIComponent(sessionId)}/approvals/${encodeURIComponent(callId)}`, { body: decision });
  }

  // Time travel: a new session holding the conversation up to message `seq` and a copy of the
  // workspace (Gateway.ForkSession). Answers {session, messages, workspace_files, workspace_bytes}.
  fork(sessionId, seq) {
    return this.call("POST", `/v1/sessions/${encodeURIComponent(sessionId)}:fork`, { body: { at_seq: seq } });
  }

  // Yields {id, event, data} for each SSE message of a chat (or of a resumed one).
  async *chat(sessionId, body, { lastEventId, signal } = {}) {
    const headers = this.headers({ "Content-Type": "application/json", Accept: "text/event-stream" });
    if (lastEventId) headers["Last-Event-ID"] = lastEventId;
    const response = await fetch(`/v1/sessions/${encodeURIComponent(sessionId)}/chat`, {
      method: "POST",
      headers,
      body: JSON.stringify(body),
      signal,
    });
    if (!response.ok || !(response.headers.get("content-type") || "").startsWith("text/event-stream")) {
      await this.#json(response);
      throw new ApiError(response.status, "UNKNOWN", "the server did not answer with an event stream");
    }
    yield* parseEventStream(response.body);
  }
}

export async function* parseEventStream(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const message = { id: "", event: "message", data: "" };
      const data = [];
      for (const line of block.split("\n")) {
        if (!line || line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        const text = colon < 0 ? "" : line.slice(colon + 1).replace(/^ /, "");
        if (field === "id") message.id = text;
        else if (field === "event") message.event = text;
        else if (field === "data") data.push(text);
      }
      if (!data.length) continue;
      message.data = JSON.parse(data.join("\n"));
      yield message;
    }
  }
}
