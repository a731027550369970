// The approval inbox: sign in with a token, follow what waits for you, decide, answer.
//
// The token lives in this tab's sessionStorage and goes to this server only, as the
// bearer header. The list comes from GET /v1/approvals/stream, read with fetch() (an
// EventSource cannot send the header; a token in a URL would land in logs). Every value
// from the server is written with textContent: a run's text is never markup here.
"use strict";

(() => {
  const KEY = "agent-jobs.token";
  const $ = (id) => document.getElementById(id);
  let token = null;
  let live = null; // the AbortController of the stream being read
  let retries = 0;
  const shown = { approvals: new Map(), questions: new Map() };

  function api(path, options = {}) {
    const headers = { Authorization: "Bearer " + token, ...(options.headers || {}) };
    if (options.body !== undefined) headers["Content-Type"] = "application/json";
    return fetch(path, { ...options, headers, cache: "no-store", credentials: "omit" });
  }

  async function problem(response) {
    try {
      const body = await response.json();
      return body.error || response.status + " " + response.statusText;
    } catch {
      return response.status + " " + response.statusText;
    }
  }

  // Characters that could hide, move or reorder what is shown (controls, bidi
  // overrides, zero-width marks, separators, unassigned code points) are shown as their
  // escapes, as on the terminal: an approver sees the arguments as they are.
  const HIDING = /[\p{Cc}\p{Cf}\p{Cs}\p{Co}\p{Cn}\p{Zl}\p{Zp}]/gu;

  function visible(text, keep = "") {
    return String(text).replace(HIDING, (c) => {
      if (keep.includes(c)) return c;
      const code = c.codePointAt(0);
      if (code < 0x100) return "\\x" + code.toString(16).padStart(2, "0");
      if (code < 0x10000) return "\\u" + code.toString(16).padStart(4, "0");
      return "\\U" + code.toString(16).padStart(8, "0");
    });
  }

  function el(tag, className, text, keep) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    if (text !== undefined && text !== null) node.textContent = visible(text, keep);
    return node;
  }

  function ago(iso) {
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

  function when(iso) {
    const node = el("time", "ago", ago(iso));
    node.dateTime = iso || "";
    node.title = iso || "";
    return node;
  }

  function setStatus(text) {
    $("status").textContent = visible(text);
  }

  // --- signing in and out -------------------------------------------------------------

  function stop() {
    if (live) live.abort();
    live = null;
  }

  function signOut(message) {
    stop();
    token = null;
    sessionStorage.removeItem(KEY);
    for (const map of Object.values(shown)) {
      for (const node of map.values()) node.remove();
      map.clear();
    }
    $("decided").replaceChildren();
    $("inbox").hidden = true;
    $("who").hidden = true;
    $("sign-in").hidden = false;
    $("sign-in-error").textContent = visible(message || "");
    $("token").value = "";
    $("token").focus();
  }

  async function signIn(candidate) {
    token = candidate;
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
    const roles = me.roles.length ? " (" + me.roles.join(", ") + ")" : "";
    $("actor").textContent = visible("Signed in as " + me.actor + roles);
    $("sign-in").hidden = true;
    $("sign-in-error").textContent = "";
    $("who").hidden = false;
    $("inbox").hidden = false;
    follow();
  }

  // --- the live list ------------------------------------------------------------------

  async function follow() {
    stop();
    const controller = new AbortController();
    live = controller;
    setStatus("Connecting…");
    try {
      const response = await api("/v1/approvals/stream", {
        signal: controller.signal,
        headers: { Accept: "text/event-stream" },
      });
      if (response.status === 401) {
        signOut("The token was refused; sign in again.");
        return;
      }
      if (!response.ok || !response.body) throw new Error(await problem(response));
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
        retries = 0;
        setStatus("Live: this list updates by itself.");
      }
      throw new Error("the stream ended");
    } catch (error) {
      if (controller.signal.aborted || live !== controller) return;
      retries = Math.min(retries + 1, 6);
      setStatus("Reconnecting… (" + error.message + ")");
      setTimeout(() => {
        if (live === controller) follow();
      }, 500 * retries);
    }
  }

  function dispatch(block) {
    const data = block
      .split("\n")
      .filter((line) => line.startsWith("data:"))
      .map((line) => line.slice(5).replace(/^ /, ""))
      .join("\n");
    if (data) render(JSON.parse(data));
  }

  async function refresh() {
    const response = await api("/v1/approvals");
    if (response.ok) render(await response.json());
  }

  function render(doc) {
    sync($("approvals"), shown.approvals, doc.approvals, (a) => a.run_id + " " + a.call_id, approvalItem);
    sync($("questions"), shown.questions, doc.questions, (q) => q.run_id + " " + q.request_id, questionItem);
    $("approval-count").textContent = doc.approvals.length ? "(" + doc.approvals.length + ")" : "";
    $("question-count").textContent = doc.questions.length ? "(" + doc.questions.length + ")" : "";
    $("no-approvals").hidden = doc.approvals.length > 0;
    $("no-questions").hidden = doc.questions.length > 0;
  }

  // Items are kept by key, so what someone is typing survives the list's updates.
  function sync(list, map, items, key, make) {
    const wanted = new Set(items.map(key));
    for (const [k, node] of map) {
      if (!wanted.has(k)) {
        node.remove();
        map.delete(k);
      }
    }
    for (const item of items) {
      const k = key(item);
      if (!map.has(k)) {
        const node = make(item);
        map.set(k, node);
        list.appendChild(node);
      }
    }
  }

  function heading(item, what) {
    const head = el("div", "head");
    head.append(el("span", "tool", item.tool), " ", el("span", "what", what));
    const meta = el("div", "meta");
    meta.append("run ", el("code", "run", item.run_id), " · asked by ", el("span", "asker", item.actor), " · ", when(item.requested_at));
    return [head, meta];
  }

  function approvalItem(item) {
    const node = el("li", "item approval");
    node.dataset.run = item.run_id;
    node.dataset.call = item.call_id;
    node.append(...heading(item, "call " + item.call_id));
    // What the approver judges the call by: the agent, what the run was asked, and what
    // the model said when it made the call (as text, never markup).
    const context = el("div", "context");
    context.append(el("div", "meta", "agent " + item.agent));
    context.append(el("div", "label", "Asked"), el("blockquote", "input", item.input + (item.input_cut ? " …" : ""), "\n"));
    if (item.said) context.append(el("div", "label", "The model said"), el("blockquote", "said", item.said, "\n"));
    node.append(context);
    if (item.deadline || item.escalated) {
      const due = el("div", "meta due");
      if (item.escalated) due.append(el("strong", "escalated", "escalated"), " · ");
      if (item.deadline) {
        const at = el("time", "deadline", "decide by " + new Date(item.deadline).toLocaleString());
        at.dateTime = item.deadline;
        due.append(at, " (then it is " + item.then + ")");
      }
      node.append(due);
    }
    // JSON escapes the newlines inside strings; the ones left are its own layout.
    node.append(el("pre", "args", JSON.stringify(item.args, null, 2), "\n"));
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
    approve.addEventListener("click", () => decide(item, "approve", reason, buttons, outcome));
    reject.addEventListener("click", () => decide(item, "reject", reason, buttons, outcome));
    row.append(reason, approve, reject);
    node.append(row, outcome);
    return node;
  }

  async function decide(item, decision, reason, buttons, outcome) {
    for (const button of buttons) button.disabled = true;
    outcome.textContent = "Sending…";
    // Bound to the arguments shown: other arguments would be refused.
    const body = { decision, args_sha256: item.args_sha256 };
    if (reason.value.trim()) body.reason = reason.value.trim();
    const path = "/v1/runs/" + encodeURIComponent(item.run_id) + "/approvals/" + encodeURIComponent(item.call_id);
    let response;
    try {
      response = await api(path, { method: "POST", body: JSON.stringify(body) });
    } catch (error) {
      outcome.textContent = "Not sent: " + error.message;
      for (const button of buttons) button.disabled = false;
      return;
    }
    if (response.status === 401) {
      signOut("The token was refused; sign in again.");
      return;
    }
    if (!response.ok) {
      const said = visible(await problem(response));
      outcome.textContent = said;
      if (response.status !== 409) {
        for (const button of buttons) button.disabled = false;
        return;
      }
      // Decided by someone else first: the item leaves the list, what became of it stays.
      log("Not recorded: " + item.tool + " (" + item.call_id + ") of run " + item.run_id + ": " + said);
      refresh();
      return;
    }
    const verb = decision === "approve" ? "Approved" : "Rejected";
    log(verb + " " + item.tool + " (" + item.call_id + ") of run " + item.run_id);
    outcome.textContent = verb + ".";
    refresh();
  }

  function questionItem(item) {
    const node = el("li", "item question");
    node.dataset.run = item.run_id;
    node.dataset.request = item.request_id;
    node.append(...heading(item, "asks"));
    const fields = [];
    for (const asked of item.questions) {
      const label = el("label", "asked", asked.question);
      const input = el("input", "answer");
      input.type = "text";
      input.dataset.question = asked.id;
      input.maxLength = 10000;
      label.append(input);
      fields.push(input);
      node.append(label);
    }
    const send = el("button", "send", "Send answers");
    send.type = "button";
    const outcome = el("p", "outcome");
    outcome.setAttribute("role", "status");
    send.addEventListener("click", () => answer(item, fields, send, outcome));
    node.append(send, outcome);
    return node;
  }

  async function answer(item, fields, send, outcome) {
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
    const path = "/v1/runs/" + encodeURIComponent(item.run_id) + "/answers/" + encodeURIComponent(item.request_id);
    const response = await api(path, { method: "POST", body: JSON.stringify({ answers }) });
    if (response.status === 401) {
      signOut("The token was refused; sign in again.");
      return;
    }
    if (!response.ok) {
      outcome.textContent = visible(await problem(response));
      if (response.status !== 409) send.disabled = false;
      return;
    }
    log("Answered " + item.tool + " (" + item.request_id + ") of run " + item.run_id);
    refresh();
  }

  function log(text) {
    const entry = el("li", null, text + " · ");
    entry.append(when(new Date().toISOString()));
    $("decided").prepend(entry);
  }

  // --- the page -----------------------------------------------------------------------

  document.addEventListener("DOMContentLoaded", () => {
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
  });
})();
