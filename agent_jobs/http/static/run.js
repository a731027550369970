// A run's page: what it was asked and answered, its steps as a waterfall, its live text,
// the calls that wait for a person, who decided what, its delegated runs, and the
// controls the caller may use (GET /v1/runs/<id>/may).
//
// The run's frames (GET /v1/runs/<id>/stream) bring its text as it streams, and its tool
// calls' arguments as the model writes them (drafts.js); any other
// frame, and any change the list of its tree's runs (GET /v1/runs/stream?root_run_id=)
// shows, reads the run and its steps again.

import {
  $,
  answerer,
  clock,
  decider,
  duration,
  el,
  follow,
  link,
  runApi,
  runPath,
  said,
  send,
  setText,
  visible,
  when,
} from "./app.js";
import { Drafts } from "./drafts.js";
import { timeline } from "./timeline.js";

const FINISHED = ["completed", "failed", "cancelled"];
const page = {
  runId: null,
  doc: null,
  steps: [],
  frames: null, // the run's frames being read
  tree: null, // its tree's runs being read
  text: null,
  drafts: null, // the calls being written
  open: new Set(), // the steps whose details are shown
  waiting: new Map(), // call id -> its node, kept so a reason being typed survives
  refreshing: false,
  again: false,
  timer: null,
};

function setStatus(text) {
  $("status").textContent = visible(text);
}

// --- the live text --------------------------------------------------------------------

// A run's text off its frames, without the text of an attempt that failed: a
// `retrying` marker takes back the text streamed since the run's last other frame (and
// every earlier delta of its step, for deltas that name theirs), as the command line's
// reader does (agent_jobs/streams/text.py).
class LiveText {
  constructor(runId) {
    this.runId = runId;
    this.pieces = [];
    this.open = [];
    this.byStep = new Map();
    this.attempt = new Map();
  }

  feed(frame) {
    if (frame.run_id !== this.runId) return false;
    if (frame.type === "text_delta") return this.delta(frame);
    // A call's arguments being written: the step in flight, whose text stays open.
    if (frame.type === "tool_call_delta") return false;
    if (frame.type === "status" && frame.status === "retrying") {
      this.drop(this.open);
      this.open = [];
      if (typeof frame.step === "string") {
        this.drop(this.byStep.get(frame.step) || []);
        this.byStep.delete(frame.step);
        if (Number.isInteger(frame.attempt)) this.attempt.set(frame.step, frame.attempt);
      }
      return true;
    }
    this.open = [];
    return false;
  }

  delta(frame) {
    const step = typeof frame.step === "string" ? frame.step : null;
    if (step && Number.isInteger(frame.attempt) && frame.attempt < (this.attempt.get(step) || 0)) return false;
    const at = this.pieces.push(String(frame.text || "")) - 1;
    this.open.push(at);
    if (step) {
      if (!this.byStep.has(step)) this.byStep.set(step, []);
      this.byStep.get(step).push(at);
    }
    return true;
  }

  drop(positions) {
    for (const at of positions) this.pieces[at] = "";
  }

  get value() {
    return this.pieces.join("");
  }
}

function onFrame(frame) {
  if (page.drafts.feed(frame)) return; // a piece of a call's arguments
  if (page.text.feed(frame)) {
    setText($("live-text"), page.text.value, "\n");
    $("live-text").hidden = false;
    if (frame.type === "text_delta") return;
  }
  soon();
}

function followFrames(after) {
  if (page.frames) page.frames.stop();
  setText($("live-state"), "(following)");
  page.frames = follow(runApi(page.runId, "/stream"), {
    after,
    onEvent: onFrame,
    onEnd: () => {
      setText($("live-state"), "(ended)");
      soon();
      return false;
    },
    onStatus: (state, why) => {
      if (state === "refused") setText($("live-state"), "(" + why + ")");
      else if (state === "reconnecting") setText($("live-state"), "(reconnecting…)");
      else if (state === "live") setText($("live-state"), "(following)");
    },
  });
}

// --- reading the run ------------------------------------------------------------------

// Read the run and its steps again, soon: frames come in bursts.
function soon() {
  if (page.timer) return;
  page.timer = setTimeout(() => {
    page.timer = null;
    refresh();
  }, 100);
}

async function refresh() {
  if (page.refreshing) {
    page.again = true;
    return;
  }
  page.refreshing = true;
  const runId = page.runId;
  try {
    const [[response, doc], [mayResponse, may], [stepsResponse, steps]] = await Promise.all([
      send("GET", runApi(runId)),
      send("GET", runApi(runId, "/may")),
      send("GET", runApi(runId, "/steps")),
    ]);
    if (runId !== page.runId) return;
    if (response.status === 404) {
      missing();
      return;
    }
    if (!response.ok) {
      setStatus("The run could not be read: " + said(response, doc));
      return;
    }
    if (stepsResponse.ok) page.steps = steps.steps;
    const before = page.doc;
    page.doc = mayDo(doc, mayResponse.ok ? may : null);
    render(before);
    setStatus("Live: this page updates by itself.");
  } catch (error) {
    setStatus("The run could not be read: " + error.message);
  } finally {
    page.refreshing = false;
    if (page.again) {
      page.again = false;
      soon();
    }
  }
}

// What the caller may do (GET /v1/runs/<id>/may), put where the page reads it: the run's
// `may` (its controls), each pending call's `may_decide`, each unknown one's
// `may_reconcile`. Unread, it may do nothing.
function mayDo(doc, may) {
  const decide = new Set(may ? may.decide : []);
  const reconcile = new Set(may ? may.reconcile : []);
  doc.may = may ? may.controls : [];
  for (const call of doc.pending_calls || []) call.may_decide = decide.has(call.call_id);
  for (const call of doc.unknown_calls || []) call.may_reconcile = reconcile.has(call.call_id);
  return doc;
}

function missing() {
  leaveRun();
  $("run").hidden = true;
  $("run-missing").hidden = false;
  setStatus("");
  document.title = "No such run · agent-jobs";
}

export function showRun(runId) {
  leaveRun();
  page.runId = runId;
  page.text = new LiveText(runId);
  page.drafts = new Drafts(runId, $("drafts"));
  document.title = "Run " + visible(runId) + " · agent-jobs";
  setStatus("Reading the run…");
  start();
}

async function start() {
  const runId = page.runId;
  await refresh();
  if (runId !== page.runId || !page.doc) return;
  followFrames(null);
  const tree = new URLSearchParams({ root_run_id: page.doc.root_run_id });
  page.tree = follow("/v1/runs/stream?" + tree.toString(), {
    onEvent: (doc) => {
      renderTree(doc.runs);
      const mine = doc.runs.find((r) => r.run_id === page.runId);
      const moved = (run) =>
        run.status !== page.doc.status || Date.parse(run.updated_at) !== Date.parse(page.doc.updated_at);
      if (mine && page.doc && moved(mine)) soon();
    },
  });
}

export function leaveRun() {
  for (const part of ["frames", "tree"]) {
    if (page[part]) page[part].stop();
    page[part] = null;
  }
  clearTimeout(page.timer);
  page.timer = null;
  page.runId = null;
  page.doc = null;
  page.steps = [];
  page.open.clear();
  page.waiting.clear();
  $("waiting").replaceChildren();
  if (page.drafts) page.drafts.clear();
}

// --- what the page shows --------------------------------------------------------------

function render(before) {
  const doc = page.doc;
  $("run-missing").hidden = true;
  $("run").hidden = false;
  $("run").dataset.status = doc.status;
  setText($("run-id"), doc.run_id);
  setText($("run-status"), doc.status.replace("_", " "));
  $("run-status").className = "badge status-" + doc.status;
  renderFacts(doc);
  renderResult(doc);
  renderControls(doc);
  renderWaiting(doc);
  renderDecisions(doc);
  $("timeline").replaceChildren(...timeline(page.steps, doc, { open: page.open, fork: forkAt }));
  const span = spanOf(page.steps);
  setText($("span"), span === null ? "" : "(" + duration(span) + ")");
  fillForkSteps();
  // A run brought back (resumed, retried) streams again after the frames already read.
  const wasOver = before && FINISHED.includes(before.status);
  if (wasOver && !FINISHED.includes(doc.status) && page.frames && page.frames.stopped) {
    followFrames(page.frames.lastId);
  }
}

function spanOf(steps) {
  const starts = steps.map((s) => Date.parse(s.started_at)).filter(Number.isFinite);
  const ends = steps.map((s) => Date.parse(s.finished_at)).filter(Number.isFinite);
  if (!starts.length || !ends.length) return null;
  return Math.max(0, Math.max(...ends) - Math.min(...starts));
}

function fact(list, name, ...value) {
  const dd = el("dd");
  dd.append(...value);
  list.append(el("dt", null, name), dd);
}

function runLink(runId) {
  const node = link(runPath(runId), null, "run-link");
  node.append(el("code", null, runId));
  return node;
}

function renderFacts(doc) {
  const facts = $("facts");
  facts.replaceChildren();
  fact(facts, "agent", el("span", "agent", doc.agent));
  fact(facts, "actor", el("span", "asker", doc.actor));
  fact(facts, "thread", el("code", "thread", doc.thread_id));
  if (doc.parent_run_id) fact(facts, "delegated by", runLink(doc.parent_run_id));
  if (doc.waiting_on) fact(facts, "waiting on", el("span", "waiting-on", doc.waiting_on));
  // A sleeping run (the `wait` tool): when it wakes, unless a message wakes it first.
  if (doc.wake_at) fact(facts, "wakes", clock(doc.wake_at));
  fact(facts, "created", clock(doc.created_at), " (", when(doc.created_at), ")");
  if (doc.finished_at) {
    fact(facts, "finished", clock(doc.finished_at));
    const took = Date.parse(doc.finished_at) - Date.parse(doc.created_at);
    fact(facts, "took", el("span", "took", duration(took)));
  }
  const usage = doc.usage;
  if (usage && usage.model_calls) {
    let text = usage.model_calls + " model call" + (usage.model_calls === 1 ? "" : "s") + ", ";
    text += usage.input_tokens + " tokens in, " + usage.output_tokens + " out";
    if (usage.cost !== null && usage.cost !== undefined) text += ", $" + Number(usage.cost).toFixed(4);
    fact(facts, "usage", el("span", "usage", text));
  }
  // Who paused, resumed, retried or forked it, and when.
  for (const control of doc.controls || []) {
    const what = String(control.event || "").replace(/^run\//, "");
    fact(facts, what, el("span", "control", "by " + (control.by || "?") + " "), when(control.at));
  }
}

function renderResult(doc) {
  setText($("run-input"), doc.input, "\n");
  const part = $("result");
  part.replaceChildren();
  if (doc.output !== null && doc.output !== undefined) {
    part.append(el("h3", null, "Output"), el("pre", "text output", doc.output, "\n"));
  }
  if (doc.error) {
    const kind = doc.error_type ? doc.error_type + ": " : "";
    part.append(el("h3", null, "Error"), el("pre", "text error run-error", kind + doc.error, "\n"));
  }
}

// --- controls -------------------------------------------------------------------------

const CONTROLS = [
  ["pause", "Pause", "Pause asked: the run stops at its next step."],
  ["resume", "Resume", "Resumed."],
  ["retry", "Retry", "Retrying its failed step."],
  ["cancel", "Cancel run", "Cancel asked: the run stops at its next step."],
];

function renderControls(doc) {
  const may = new Set(doc.may || []);
  const row = $("controls");
  const wanted = CONTROLS.filter(([name]) => may.has(name)).map(([name]) => name);
  const shown = [...row.querySelectorAll("button.control")].map((b) => b.dataset.control);
  if (wanted.join() !== shown.join()) {
    row.replaceChildren();
    for (const [name, label, done] of CONTROLS) {
      if (!may.has(name)) continue;
      const button = el("button", "control " + name, label);
      button.type = "button";
      button.dataset.control = name;
      button.addEventListener("click", () => control(button, name, label, done));
      row.append(button);
    }
    if (may.has("message")) row.append(messageForm());
  }
  $("fork").hidden = !may.has("fork");
}

async function control(button, name, label, done) {
  // A cancel is asked twice: it cannot be taken back.
  if (name === "cancel" && button.dataset.armed !== "yes") {
    button.dataset.armed = "yes";
    setText(button, "Really cancel?");
    return;
  }
  button.disabled = true;
  setText($("control-outcome"), "Sending…");
  const [response, doc] = await send("POST", runApi(page.runId, "/" + name));
  button.disabled = false;
  button.dataset.armed = "";
  setText(button, label);
  setText($("control-outcome"), response.ok ? done : said(response, doc));
  soon();
}

function messageForm() {
  const form = el("form", "message");
  const text = el("input", "message-text");
  text.type = "text";
  text.maxLength = 10000;
  text.placeholder = "A message for the run's next step";
  text.setAttribute("aria-label", "Message");
  const button = el("button", "send-message", "Send");
  button.type = "submit";
  form.append(text, button);
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    if (!text.value.trim()) return;
    const body = { text: text.value.trim(), when: "next-step" };
    const [response, doc] = await send("POST", runApi(page.runId, "/messages"), body);
    setText($("control-outcome"), response.ok ? "Sent: the run reads it at its next step." : said(response, doc));
    if (response.ok) text.value = "";
  });
  return form;
}

// --- forking --------------------------------------------------------------------------

function fillForkSteps() {
  const select = $("fork-at");
  const names = page.steps.map((s) => s.step);
  const shown = [...select.options].map((o) => o.value);
  if (names.join("\n") === shown.join("\n")) return;
  const chosen = select.value;
  select.replaceChildren(
    ...page.steps.map((s) => {
      const option = el("option", null, s.seq + ". " + s.step);
      option.value = s.step;
      return option;
    }),
  );
  if (names.includes(chosen)) select.value = chosen;
}

// From the timeline: choose the step, and preview the fork there.
function forkAt(step) {
  $("fork-at").value = step;
  $("fork").scrollIntoView({ block: "nearest" });
  preview();
}

async function preview() {
  const at = $("fork-at").value;
  const plan = $("fork-plan");
  plan.hidden = false;
  plan.replaceChildren(el("p", "outcome", "Reading what a fork at " + at + " would do…"));
  const [response, doc] = await send("GET", runApi(page.runId, "/fork?at=" + encodeURIComponent(at)));
  if (!response.ok) {
    plan.replaceChildren(el("p", "error", said(response, doc)));
    return;
  }
  plan.replaceChildren(...planned(doc));
}

function callList(className, calls) {
  const list = el("ul", className);
  for (const call of calls) {
    const item = el("li", null, call.tool + " (" + call.call_id + ") at ");
    item.append(el("code", null, call.step));
    list.append(item);
  }
  return list;
}

function planned(doc) {
  const parts = [el("p", null, "A new run on a new thread, reusing this run's steps before " + doc.at + ".")];
  if (doc.runs_again.length) {
    parts.push(el("p", "warning", "These side effects would run again:"), callList("runs-again", doc.runs_again));
  } else {
    parts.push(el("p", "runs-again-none", "No side effect would run again."));
  }
  const keep = el("input", "keep-decisions");
  keep.type = "checkbox";
  if (doc.asked_again.length) {
    parts.push(el("p", null, "These calls would be asked again:"), callList("asked-again", doc.asked_again));
    const label = el("label", null);
    label.append(keep, " Keep the decisions made on them, as mine");
    parts.push(label);
  }
  const go = el("button", "fork-confirm", "Fork at " + doc.at);
  go.type = "button";
  const outcome = el("p", "outcome");
  go.addEventListener("click", () => fork(doc.at, keep.checked, go, outcome));
  parts.push(go, outcome);
  return parts;
}

async function fork(at, keepDecisions, button, outcome) {
  button.disabled = true;
  setText(outcome, "Forking…");
  const body = { at };
  if (keepDecisions) body.keep_decisions = true;
  const [response, doc] = await send("POST", runApi(page.runId, "/fork"), body);
  if (!response.ok) {
    setText(outcome, said(response, doc));
    button.disabled = false;
    return;
  }
  outcome.replaceChildren("Forked: ", runLink(doc.run_id));
  location.assign(runPath(doc.run_id));
}

// --- what waits for a person ----------------------------------------------------------

function renderWaiting(doc) {
  const items = [
    // Keyed by what may be done too: a call that becomes the caller's to decide is redrawn.
    ...(doc.pending_calls || []).map((c) => ["call " + c.call_id + " " + c.may_decide, () => pendingCall(doc, c)]),
    ...(doc.unknown_calls || []).map((c) => ["unknown " + c.call_id + " " + c.may_reconcile, () => unknownCall(doc, c)]),
    ...(doc.pending_questions || []).map((q) => ["question " + q.request_id, () => question(doc, q)]),
  ];
  const wanted = new Set(items.map(([key]) => key));
  for (const [key, node] of page.waiting) {
    if (!wanted.has(key)) {
      node.remove();
      page.waiting.delete(key);
    }
  }
  for (const [key, make] of items) {
    if (!page.waiting.has(key)) {
      const node = make();
      page.waiting.set(key, node);
      $("waiting").append(node);
    }
  }
}

function pendingCall(doc, call) {
  const node = el("div", "item approval");
  node.dataset.call = call.call_id;
  const head = el("div", "head");
  head.append(el("span", "tool", call.tool), " ", el("span", "what", "call " + call.call_id + " waits for a decision"));
  node.append(head, el("pre", "args", JSON.stringify(call.args, null, 2), "\n"));
  if (!call.may_decide) {
    node.append(el("p", "meta", "It waits for a person whose roles may decide it."));
    return node;
  }
  const item = { run_id: doc.run_id, call_id: call.call_id, tool: call.tool, args_sha256: call.args_sha256 };
  node.append(...decider(item, { onDecided: soon, onTaken: soon }));
  return node;
}

function unknownCall(doc, call) {
  const node = el("div", "item unknown");
  node.dataset.call = call.call_id;
  const head = el("div", "head");
  head.append(el("span", "tool", call.tool), " ", el("span", "what", "call " + call.call_id + ": outcome unknown"));
  const meta = el("div", "meta", "Its worker stopped while it ran: did it take effect? Idempotency key ");
  meta.append(el("code", "key", call.idempotency_key));
  node.append(head, meta, el("pre", "args", JSON.stringify(call.args, null, 2), "\n"));
  if (!call.may_reconcile) {
    node.append(el("p", "meta", "It waits for a person who may say how it ended."));
    return node;
  }
  const result = el("textarea", "result");
  result.rows = 2;
  result.placeholder = '{"the": "call\'s result, as JSON"}';
  result.setAttribute("aria-label", "The call's result, as JSON");
  const failure = el("input", "failure");
  failure.type = "text";
  failure.maxLength = 2000;
  failure.placeholder = "What went wrong";
  failure.setAttribute("aria-label", "What went wrong");
  const buttons = {
    succeeded: el("button", "succeeded", "It succeeded"),
    failed: el("button", "failed", "It failed"),
    retry: el("button", "retry", "Run it again"),
  };
  const outcome = el("p", "outcome");
  outcome.setAttribute("role", "status");
  const inputs = { result, failure };
  for (const [name, button] of Object.entries(buttons)) {
    button.type = "button";
    button.addEventListener("click", () => reconcile(call, name, inputs, Object.values(buttons), outcome));
  }
  const succeeded = el("div", "reconcile");
  succeeded.append(result, buttons.succeeded);
  const failed = el("div", "reconcile");
  failed.append(failure, buttons.failed);
  const again = el("div", "reconcile");
  again.append(buttons.retry);
  node.append(succeeded, failed, again, outcome);
  return node;
}

function reconcileBody(name, { result, failure }) {
  if (name === "retry") return { outcome: "retry" };
  if (name === "failed") {
    if (!failure.value.trim()) throw new Error("Say what went wrong first.");
    return { outcome: "failed", error: failure.value.trim() };
  }
  if (!result.value.trim()) throw new Error("Give the call's result, as JSON, first.");
  try {
    return { outcome: "succeeded", result: JSON.parse(result.value) };
  } catch (error) {
    throw new Error("The result is not JSON: " + error.message);
  }
}

async function reconcile(call, name, inputs, buttons, outcome) {
  let body;
  try {
    body = reconcileBody(name, inputs);
  } catch (error) {
    setText(outcome, error.message);
    return;
  }
  for (const button of buttons) button.disabled = true;
  setText(outcome, "Sending…");
  const path = runApi(page.runId, "/reconcile/" + encodeURIComponent(call.call_id));
  const [response, doc] = await send("POST", path, body);
  setText(outcome, response.ok ? "Recorded." : said(response, doc));
  if (!response.ok && response.status !== 409) for (const button of buttons) button.disabled = false;
  soon();
}

// Answered here by those who may (its actor, a service: who may also message it), else
// a pointer to the inbox, where its actor answers.
function question(doc, asked) {
  const node = el("div", "item question");
  node.dataset.request = asked.request_id;
  const head = el("div", "head");
  head.append(el("span", "tool", asked.tool), " ", el("span", "what", "asks"));
  node.append(head);
  if ((doc.may || []).includes("message")) {
    const item = { ...asked, run_id: doc.run_id };
    node.append(...answerer(item, { onAnswered: soon }));
    return node;
  }
  for (const q of asked.questions) node.append(el("div", "asked", q.question));
  const where = el("p", "meta", "Its actor answers it in the ");
  where.append(link("/", "inbox"), ".");
  node.append(where);
  return node;
}

// --- decisions and delegated runs -----------------------------------------------------

function renderDecisions(doc) {
  const decisions = doc.decisions || [];
  $("no-decisions").hidden = decisions.length > 0;
  $("decisions").replaceChildren(
    ...decisions.map((d) => {
      const item = el("li", "decision");
      item.dataset.call = d.call_id;
      item.append(
        el("span", "tool", d.tool),
        " (" + visible(d.call_id) + "): ",
        el("strong", "verdict " + d.decision, d.decision),
        " by ",
        el("span", "decider", d.decided_by),
        " · ",
      );
      item.append(when(d.decided_at));
      if (d.reason) item.append(" · ", el("q", "reason", d.reason));
      return item;
    }),
  );
}

function renderTree(runs) {
  const children = new Map();
  for (const run of runs) {
    const parent = run.parent_run_id || "";
    if (!children.has(parent)) children.set(parent, []);
    children.get(parent).push(run);
  }
  const root = runs.find((r) => !r.parent_run_id) || runs.find((r) => r.run_id === page.doc?.root_run_id);
  $("tree-part").hidden = runs.length < 2 || !root;
  if (!root) return;
  $("tree").replaceChildren(branch([root], children, 0));
}

function branch(runs, children, depth) {
  const list = el("ul", "branch");
  // Oldest first: the order they were delegated in.
  for (const run of [...runs].sort((a, b) => Date.parse(a.created_at) - Date.parse(b.created_at))) {
    const item = el("li", "node");
    item.dataset.run = run.run_id;
    const name = runLink(run.run_id);
    if (run.run_id === page.runId) name.setAttribute("aria-current", "page");
    item.append(name, " ", el("span", "badge status-" + run.status, run.status.replace("_", " ")), " ");
    item.append(el("span", "agent", run.agent));
    const below = children.get(run.run_id);
    if (below && depth < 20) item.append(branch(below, children, depth + 1));
    list.append(item);
  }
  return list;
}

// Modules run once the page is parsed: its elements are there.
$("fork-preview").addEventListener("click", preview);
