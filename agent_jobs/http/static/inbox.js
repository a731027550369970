// The approval inbox: follow what waits for you, decide, answer.
//
// The list comes from GET /v1/approvals/stream; signing in, the API, the stream reader
// and the decision widget are the console's too (app.js). Every value from the server
// is written with textContent: a run's text is never markup here.

import { $, answerer, api, decider, el, follow, link, runPath, start, visible, when } from "./app.js";

const shown = { approvals: new Map(), questions: new Map() };
let live = null; // the stream being read

function setStatus(text) {
  $("status").textContent = visible(text);
}

function onStatus(state, why) {
  if (state === "live") setStatus("Live: this list updates by itself.");
  else if (state === "reconnecting") setStatus("Reconnecting… (" + why + ")");
  else if (state === "refused") setStatus("The list cannot be read: " + why);
}

function begin() {
  stop();
  setStatus("Connecting…");
  live = follow("/v1/approvals/stream", { onEvent: render, onStatus });
}

function stop() {
  if (live) live.stop();
  live = null;
}

function forget() {
  stop();
  for (const map of Object.values(shown)) {
    for (const node of map.values()) node.remove();
    map.clear();
  }
  $("decided").replaceChildren();
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
  const run = link(runPath(item.run_id), null, "run-link");
  run.append(el("code", "run", item.run_id));
  meta.append("run ", run, " · asked by ", el("span", "asker", item.actor), " · ", when(item.requested_at));
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
  const what = item.tool + " (" + item.call_id + ") of run " + item.run_id;
  node.append(
    ...decider(item, {
      onDecided: (verb) => {
        log(verb + " " + what);
        refresh();
      },
      // Decided by someone else first: the item leaves the list, what became of it stays.
      onTaken: (why) => {
        log("Not recorded: " + what + ": " + why);
        refresh();
      },
    }),
  );
  return node;
}

function questionItem(item) {
  const node = el("li", "item question");
  node.dataset.run = item.run_id;
  node.dataset.request = item.request_id;
  node.append(...heading(item, "asks"));
  const what = item.tool + " (" + item.request_id + ") of run " + item.run_id;
  node.append(
    ...answerer(item, {
      onAnswered: () => {
        log("Answered " + what);
        refresh();
      },
    }),
  );
  return node;
}

function log(text) {
  const entry = el("li", null, text + " · ");
  entry.append(when(new Date().toISOString()));
  $("decided").prepend(entry);
}

start({ view: "inbox", signedIn: begin, signedOut: forget });
