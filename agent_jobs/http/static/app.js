// What the inbox and the console share: signing in and out, calling the API, writing
// server values as text, times and durations, event streams read with fetch(), and the
// widget that decides a call.
//
// The token lives in this tab's sessionStorage and goes to this server only, as the
// bearer header. Streams are read with fetch() (an EventSource cannot send the header;
// a token in a URL would land in logs). Every value from the server is written with
// textContent, never as markup.

const KEY = "agent-jobs.token";
export const $ = (id) => document.getElementById(id);

// Who is signed in: the token, and what GET /v1/me said of it.
export const session = { token: null, actor: null, roles: [] };
const hooks = { signedIn: () => {}, signedOut: () => {}, view: null };

// --- writing values as text -----------------------------------------------------------

// Characters that could hide, move or reorder what is shown (controls, bidi
// overrides, zero-width marks, separators, unassigned code points) are shown as their
// escapes, as on the terminal: a person sees a value as it is.
const HIDING = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}]/gu;

export function visible(text, keep = "") {
  return String(text).replace(HIDING, (c) => {
    if (keep.includes(c)) return c;
    const code = c.codePointAt(0);
    if (code < 0x100) return "\\x" + code.toString(16).padStart(2, "0");
    if (code < 0x10000) return "\\u" + code.toString(16).padStart(4, "0");
    return "\\U" + code.toString(16).padStart(8, "0");
  });
}

export function el(tag, className, text, keep) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined && text !== null) node.textContent = visible(text, keep);
  return node;
}

export function setText(node, text, keep) {
  node.textContent = visible(text === undefined || text === null ? "" : text, keep);
}

// A value as indented JSON, for a <pre>: JSON escapes the newlines inside strings, so
// the ones left are its own layout (keep "\n" when writing it).
export function pretty(value) {
  if (value === undefined) return "";
  return typeof value === "string" ? JSON.stringify(value) : JSON.stringify(value, null, 2);
}

export function link(href, text, className) {
  const node = el("a", className, text);
  node.href = href;
  return node;
}

// A run's page, and its place in the API.
export function runPath(runId) {
  return "/runs/" + encodeURIComponent(runId);
}

export function runApi(runId, rest = "") {
  return "/v1/runs/" + encodeURIComponent(runId) + rest;
}

// --- times and durations --------------------------------------------------------------

export function ago(iso) {
  const seconds = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  if (!Number.isFinite(seconds)) return "";
  if (seconds < 10) return "just now";
  if (seconds < 60) return seconds + " s ago";
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return minutes + " min ago";
  const hours = Math.floor(minutes / 60);
  if (hours < 48) return hours + " h ago";
  return Math.floor(hours / 24) + " days ago";
}

// A moment as "how long ago", its exact time on hover; kept fresh by start().
export function when(iso) {
  const node = el("time", "ago", iso ? ago(iso) : "");
  node.dateTime = iso || "";
  node.title = iso ? new Date(iso).toLocaleString() : "";
  return node;
}

// A moment as the reader's local date and time.
export function clock(iso) {
  const node = el("time", "clock", iso ? new Date(iso).toLocaleString() : "—");
  node.dateTime = iso || "";
  return node;
}

export function duration(ms) {
  if (ms === null || ms === undefined || !Number.isFinite(ms)) return "";
  if (ms < 1) return "<1 ms";
  if (ms < 1000) return Math.round(ms) + " ms";
  const seconds = ms / 1000;
  if (seconds < 60) return seconds.toFixed(seconds < 10 ? 2 : 1) + " s";
  const minutes = Math.floor(seconds / 60);
  if (minutes < 60) return minutes + " min " + Math.round(seconds % 60) + " s";
  return Math.floor(minutes / 60) + " h " + (minutes % 60) + " min";
}

// --- the API --------------------------------------------------------------------------

// A request with the bearer token. A 401 signs the tab out: the token was revoked.
export async function api(path, options = {}) {
  const headers = { Authorization: "Bearer " + session.token, ...(options.headers || {}) };
  if (options.body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(path, { ...options, headers, cache: "no-store", credentials: "omit" });
  if (response.status === 401 && session.token) signOut("The token was refused; sign in again.");
  return response;
}

// A JSON body sent with `method`: (the response, its JSON or null).
export async function send(method, path, body) {
  const options = { method };
  if (body !== undefined) options.body = JSON.stringify(body);
  const response = await api(path, options);
  let doc = null;
  try {
    doc = await response.json();
  } catch {
    doc = null;
  }
  return [response, doc];
}

export async function problem(response) {
  try {
    const body = await response.json();
    return body.error || response.status + " " + response.statusText;
  } catch {
    return response.status + " " + response.statusText;
  }
}

export function said(response, doc) {
  return (doc && doc.error) || response.status + " " + response.statusText;
}

// --- event streams over fetch ---------------------------------------------------------

// Reads the event stream at `path` and calls `onEvent(data, id)` for each event (its
// data parsed as JSON). When the stream breaks it comes back after a pause, asking for
// the events after the last id it saw. When the server ends it, `onEnd()` says
// whether to come back (an approvals or runs list: yes; a run's frames: they are over).
export function follow(path, { onEvent, onStatus = () => {}, onEnd = () => true, after = null }) {
  const state = { controller: null, lastId: after, retries: 0, stopped: false };

  async function connect() {
    const controller = new AbortController();
    state.controller = controller;
    const headers = { Accept: "text/event-stream" };
    if (state.lastId) headers["Last-Event-ID"] = state.lastId;
    try {
      const response = await api(path, { signal: controller.signal, headers });
      if (response.status === 401) return;
      if (!response.ok || !response.body) {
        const error = new Error(await problem(response));
        error.status = response.status;
        throw error;
      }
      onStatus("live");
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value.replace(/\r/g, "");
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          dispatch(buffer.slice(0, cut));
          buffer = buffer.slice(cut + 2);
        }
        state.retries = 0;
      }
      if (state.stopped || state.controller !== controller) return;
      if (!onEnd()) {
        state.stopped = true;
        onStatus("ended");
        return;
      }
      throw new Error("the stream ended");
    } catch (error) {
      if (state.stopped || controller.signal.aborted || state.controller !== controller) return;
      // A refusal (no such run, bad filters, not yours) stays one: asking again would not help.
      if (error.status >= 400 && error.status < 500 && error.status !== 408 && error.status !== 429) {
        state.stopped = true;
        onStatus("refused", error.message);
        return;
      }
      state.retries = Math.min(state.retries + 1, 6);
      onStatus("reconnecting", error.message);
      setTimeout(() => {
        if (!state.stopped && state.controller === controller) connect();
      }, 500 * state.retries);
    }
  }

  function dispatch(block) {
    let name = "message";
    let id = null;
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      else if (line.startsWith("id:")) id = line.slice(3).trim();
      else if (line.startsWith("event:")) name = line.slice(6).trim();
    }
    if (!data.length) return;
    const parsed = JSON.parse(data.join("\n"));
    if (name === "error") throw new Error(parsed.error || "the stream failed");
    if (id) state.lastId = id;
    onEvent(parsed, id);
  }

  connect();
  return {
    stop() {
      state.stopped = true;
      if (state.controller) state.controller.abort();
    },
    get lastId() {
      return state.lastId;
    },
    get stopped() {
      return state.stopped;
    },
  };
}

// --- deciding a call ------------------------------------------------------------------

// A reason field and Approve / Reject for the call `item` ({run_id, call_id, tool,
// args_sha256}). The decision is bound to the arguments shown (args_sha256): other
// arguments would be refused. `onDecided(verb)` after it is recorded; `onTaken(said)`
// when someone decided first (409). Returns the nodes to append.
export function decider(item, { onDecided = () => {}, onTaken = () => {} } = {}) {
  const row = el("div", "decide");
  const reason = el("input", "reason");
  reason.type = "text";
  reason.placeholder = "Reason (optional, for the record; the model sees a rejection's)";
  reason.maxLength = 2000;
  reason.setAttribute("aria-label", "Reason");
  const approve = el("button", "approve", "Approve");
  const reject = el("button", "reject", "Reject");
  approve.type = reject.type = "button";
  const outcome = el("p", "outcome");
  outcome.setAttribute("role", "status");
  const buttons = [approve, reject];
  const go = (decision) => decide(item, decision, reason, buttons, outcome, { onDecided, onTaken });
  approve.addEventListener("click", () => go("approve"));
  reject.addEventListener("click", () => go("reject"));
  row.append(reason, approve, reject);
  return [row, outcome];
}

async function decide(item, decision, reason, buttons, outcome, { onDecided, onTaken }) {
  for (const button of buttons) button.disabled = true;
  outcome.textContent = "Sending…";
  const body = { decision, args_sha256: item.args_sha256 };
  if (reason.value.trim()) body.reason = reason.value.trim();
  const path = runApi(item.run_id, "/approvals/" + encodeURIComponent(item.call_id));
  let response;
  try {
    response = await api(path, { method: "POST", body: JSON.stringify(body) });
  } catch (error) {
    outcome.textContent = "Not sent: " + error.message;
    for (const button of buttons) button.disabled = false;
    return;
  }
  if (response.status === 401) return;
  if (!response.ok) {
    const why = visible(await problem(response));
    outcome.textContent = why;
    if (response.status === 409) onTaken(why);
    else for (const button of buttons) button.disabled = false;
    return;
  }
  const verb = decision === "approve" ? "Approved" : "Rejected";
  outcome.textContent = verb + ".";
  onDecided(verb);
}

// --- answering a run's questions -----------------------------------------------------

// A field for each question of `item` ({run_id, request_id, questions: [{id, question}]})
// and Send answers; `onAnswered()` once they are recorded. Returns the nodes to append.
export function answerer(item, { onAnswered = () => {} } = {}) {
  const nodes = [];
  const fields = [];
  for (const asked of item.questions) {
    const label = el("label", "asked", asked.question);
    const input = el("input", "answer");
    input.type = "text";
    input.dataset.question = asked.id;
    input.maxLength = 10000;
    label.append(input);
    fields.push(input);
    nodes.push(label);
  }
  const send = el("button", "send", "Send answers");
  send.type = "button";
  const outcome = el("p", "outcome");
  outcome.setAttribute("role", "status");
  send.addEventListener("click", () => answer(item, fields, send, outcome, onAnswered));
  return [...nodes, send, outcome];
}

async function answer(item, fields, send, outcome, onAnswered) {
  const answers = {};
  for (const input of fields) {
    if (!input.value.trim()) {
      outcome.textContent = "Answer every question first.";
      input.focus();
      return;
    }
    answers[input.dataset.question] = input.value.trim();
  }
  send.disabled = true;
  outcome.textContent = "Sending…";
  const path = runApi(item.run_id, "/answers/" + encodeURIComponent(item.request_id));
  const response = await api(path, { method: "POST", body: JSON.stringify({ answers }) });
  if (response.status === 401) return;
  if (!response.ok) {
    outcome.textContent = visible(await problem(response));
    if (response.status !== 409) send.disabled = false;
    return;
  }
  outcome.textContent = "Answered.";
  onAnswered();
}

// --- signing in and out ---------------------------------------------------------------

export function signOut(message) {
  session.token = null;
  session.actor = null;
  session.roles = [];
  sessionStorage.removeItem(KEY);
  hooks.signedOut();
  if (hooks.view) $(hooks.view).hidden = true;
  $("who").hidden = true;
  $("sign-in").hidden = false;
  $("sign-in-error").textContent = visible(message || "");
  $("token").value = "";
  $("token").focus();
}

async function signIn(candidate) {
  session.token = candidate;
  let response;
  try {
    response = await api("/v1/me");
  } catch (error) {
    signOut("The server could not be reached: " + error.message);
    return;
  }
  if (!response.ok) {
    signOut(response.status === 401 ? "That token is not known here." : await problem(response));
    return;
  }
  const me = await response.json();
  sessionStorage.setItem(KEY, candidate);
  session.actor = me.actor;
  session.roles = me.roles;
  const roles = me.roles.length ? " (" + me.roles.join(", ") + ")" : "";
  $("actor").textContent = visible("Signed in as " + me.actor + roles);
  $("sign-in").hidden = true;
  $("sign-in-error").textContent = "";
  $("who").hidden = false;
  if (hooks.view) $(hooks.view).hidden = false;
  hooks.signedIn(me);
}

// The page's start: `view` is the id of the section shown once signed in; `signedIn(me)`
// starts the view, `signedOut()` forgets what it showed.
export function start({ view, signedIn, signedOut }) {
  hooks.view = view;
  hooks.signedIn = signedIn;
  hooks.signedOut = signedOut;
  const begin = () => {
    $("sign-in-form").addEventListener("submit", (event) => {
      event.preventDefault();
      const candidate = $("token").value.trim();
      $("token").value = "";
      if (candidate) signIn(candidate);
    });
    $("sign-out").addEventListener("click", () => signOut(""));
    setInterval(() => {
      for (const node of document.querySelectorAll("time.ago")) node.textContent = ago(node.dateTime);
    }, 15000);
    const saved = sessionStorage.getItem(KEY);
    if (saved) signIn(saved);
    else signOut("");
  };
  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", begin);
  else begin();
}
