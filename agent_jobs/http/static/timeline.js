// A run's steps as a waterfall: one row a step, its bar placed between the run's first
// start and its last finish, its intent and result shown on a click.
//
// The bars are placed with CSSOM properties (element.style.left), which the page's
// policy (style-src 'self') allows; a style attribute written as markup it would not.

import { clock, duration, el, link, pretty, runPath, when } from "./app.js";

const MIN_WIDTH = 0.4; // per cent: a step of a millisecond still shows

function moment(iso) {
  const at = Date.parse(iso);
  return Number.isFinite(at) ? at : null;
}

// The waterfall's ends: the first start and the last finish (now, while a step runs).
function bounds(steps) {
  const starts = steps.map((s) => moment(s.started_at)).filter((t) => t !== null);
  if (!starts.length) return null;
  const running = steps.some((s) => moment(s.started_at) !== null && moment(s.finished_at) === null);
  const ends = steps.map((s) => moment(s.finished_at)).filter((t) => t !== null);
  if (running) ends.push(Date.now());
  const first = Math.min(...starts);
  const last = Math.max(first, ...ends);
  return { first, span: Math.max(last - first, 1) };
}

function named(step) {
  if (step.kind === "tool" && step.tool) return step.tool + " (" + step.call_id + ")";
  if (step.kind === "approval") return "approval of " + (step.tool || step.call_id || step.step);
  if (step.kind === "answers") return "answers to " + (step.tool || step.step);
  if (step.kind === "child") return "delegated run";
  return step.step;
}

function took(step) {
  if (Number.isFinite(step.duration_ms)) return duration(step.duration_ms);
  const start = moment(step.started_at);
  if (start !== null && moment(step.finished_at) === null) return "running " + duration(Date.now() - start);
  return "";
}

function bar(step, ends) {
  const track = el("div", "track");
  const start = moment(step.started_at);
  if (!ends || start === null) {
    track.classList.add("unstarted");
    return track;
  }
  const finish = moment(step.finished_at);
  const end = finish === null ? Date.now() : finish;
  const node = el("div", "bar");
  if (finish === null) node.classList.add("running");
  const left = Math.min(((start - ends.first) / ends.span) * 100, 100 - MIN_WIDTH);
  const width = Math.max(((end - start) / ends.span) * 100, MIN_WIDTH);
  node.style.left = left.toFixed(3) + "%";
  node.style.width = Math.min(width, 100 - left).toFixed(3) + "%";
  track.append(node);
  return track;
}

function fact(list, name, ...value) {
  const dd = el("dd");
  dd.append(...value);
  list.append(el("dt", null, name), dd);
}

// Who decided the call of an approval step, when, and why (the run's `decisions`).
function decision(step, doc) {
  const found = (doc.decisions || []).find((d) => d.call_id === step.call_id);
  if (!found) return step.decided_by ? [el("span", "decider", step.decided_by)] : null;
  const verdict = el("strong", "verdict " + found.decision, found.decision);
  const parts = [verdict, " by ", el("span", "decider", found.decided_by)];
  if (found.decided_at) parts.push(" · ", when(found.decided_at));
  if (found.reason) parts.push(" · ", el("q", "reason", found.reason));
  return parts;
}

function details(step, doc, fork) {
  const box = el("div", "details");
  const facts = el("dl", "facts");
  fact(facts, "step", el("code", null, step.step));
  if (step.worker) fact(facts, "worker", el("span", "worker", step.worker));
  if (step.started_at) fact(facts, "started", clock(step.started_at));
  if (step.finished_at) fact(facts, "finished", clock(step.finished_at));
  if (step.effect) fact(facts, "effect", el("span", "effect", step.effect));
  const decided = decision(step, doc);
  if (decided && (step.kind === "approval" || step.kind === "tool")) fact(facts, "decided", ...decided);
  if (step.child_run_id) {
    const child = link(runPath(step.child_run_id), null, "child-link");
    child.append(el("code", null, step.child_run_id));
    fact(facts, "run", child);
  }
  box.append(facts);
  box.append(el("h4", null, "Input"), el("pre", "json intent", pretty(step.intent), "\n"));
  if (step.result !== null && step.result !== undefined) {
    box.append(el("h4", null, "Result"), el("pre", "json result", pretty(step.result), "\n"));
  }
  if (step.error) box.append(el("h4", null, "Error"), el("pre", "json error", pretty(step.error), "\n"));
  if (fork) {
    const button = el("button", "fork-here", "Fork at this step…");
    button.type = "button";
    button.addEventListener("click", () => fork(step.step));
    box.append(button);
  }
  return box;
}

function row(step, doc, ends, { open, fork }) {
  const item = el("li", "step kind-" + step.kind + " state-" + step.state);
  item.dataset.step = step.step;
  item.dataset.kind = step.kind;
  item.dataset.state = step.state;
  const head = el("button", "step-head");
  head.type = "button";
  head.append(el("span", "seq", step.seq), el("span", "badge kind", step.kind), el("span", "name", named(step)));
  head.append(el("span", "state", step.state));
  if (step.attempts > 1) head.append(el("span", "attempts", step.attempts + " attempts"));
  if (step.kind === "approval" && step.decided_by) head.append(el("span", "decider", "by " + step.decided_by));
  head.append(el("span", "took", took(step)));
  const more = details(step, doc, (doc.may || []).includes("fork") ? fork : null);
  more.hidden = !open.has(step.step);
  head.setAttribute("aria-expanded", String(!more.hidden));
  head.addEventListener("click", () => {
    more.hidden = !more.hidden;
    head.setAttribute("aria-expanded", String(!more.hidden));
    if (more.hidden) open.delete(step.step);
    else open.add(step.step);
  });
  item.append(head, bar(step, ends), more);
  return item;
}

// The timeline's rows for `steps` of the run `doc`. `open`: the steps whose details are
// shown (kept across redraws); `fork(step)`: previews a fork there.
export function timeline(steps, doc, options) {
  const ends = bounds(steps);
  return steps.map((step) => row(step, doc, ends, options));
}
