// The runs console: the list of runs (GET /runs) and a run's page (GET /runs/<id>).
//
// The list follows GET /v1/runs/stream with the filters of the address, so a filtered
// view is a link and it updates by itself; older runs come a page at a time with the
// list's cursor. The run page is run.js. Signing in and the rest are app.js's.

import { $, api, el, follow, link, runPath, said, start, visible, when } from "./app.js";
import { leaveRun, showRun } from "./run.js";

export const STATUSES = [
  "queued",
  "running",
  "awaiting_approval",
  "awaiting_answers",
  "awaiting_reconcile",
  "paused",
  "sleeping",
  "completed",
  "failed",
  "cancelled",
];
const FIELDS = ["q", "agent", "actor", "thread_id", "schedule", "since", "until"];
const INPUT_SHOWN = 240; // characters of a run's input a row shows

const list = { live: null, first: [], firstCursor: null, older: [], olderCursor: null, loaded: false };

export function setStatus(text) {
  $("status").textContent = visible(text);
}

// --- filters, kept in the address -----------------------------------------------------

function filtersOfAddress() {
  const given = new URLSearchParams(location.search);
  const kept = new URLSearchParams();
  for (const status of given.getAll("status")) if (STATUSES.includes(status)) kept.append("status", status);
  for (const name of FIELDS) if (given.get(name)) kept.set(name, given.get(name));
  // A page's size, from the address alone (a link may ask for one; the form does not).
  if (/^[0-9]{1,3}$/.test(given.get("limit") || "")) kept.set("limit", given.get("limit"));
  return kept;
}

// An ISO moment as a datetime-local field's value (the reader's time zone), and back.
function toLocal(iso) {
  const moment = new Date(iso);
  if (Number.isNaN(moment.getTime())) return "";
  return new Date(moment.getTime() - moment.getTimezoneOffset() * 60000).toISOString().slice(0, 19);
}

function fromLocal(value) {
  const moment = new Date(value);
  return Number.isNaN(moment.getTime()) ? "" : moment.toISOString();
}

function fillForm(filters) {
  const wanted = new Set(filters.getAll("status"));
  for (const box of document.querySelectorAll("#statuses input")) box.checked = wanted.has(box.value);
  $("q").value = filters.get("q") || "";
  $("agent").value = filters.get("agent") || "";
  $("actor-filter").value = filters.get("actor") || "";
  $("thread_id").value = filters.get("thread_id") || "";
  $("schedule").value = filters.get("schedule") || "";
  $("since").value = filters.get("since") ? toLocal(filters.get("since")) : "";
  $("until").value = filters.get("until") ? toLocal(filters.get("until")) : "";
}

function filtersOfForm() {
  const filters = new URLSearchParams();
  for (const box of document.querySelectorAll("#statuses input:checked")) filters.append("status", box.value);
  const text = {
    q: $("q"),
    agent: $("agent"),
    actor: $("actor-filter"),
    thread_id: $("thread_id"),
    schedule: $("schedule"),
  };
  for (const [name, input] of Object.entries(text)) if (input.value.trim()) filters.set(name, input.value.trim());
  for (const name of ["since", "until"]) {
    const value = $(name).value && fromLocal($(name).value);
    if (value) filters.set(name, value);
  }
  const limit = filtersOfAddress().get("limit");
  if (limit) filters.set("limit", limit);
  return filters;
}

function apply(filters) {
  const query = filters.toString();
  const address = "/runs" + (query ? "?" + query : "");
  if (location.pathname + location.search !== address) history.pushState(null, "", address);
  followRuns(filters);
}

function buildFilters() {
  const boxes = $("statuses");
  for (const status of STATUSES) {
    const box = el("input");
    box.type = "checkbox";
    box.value = status;
    box.name = "status";
    const label = el("label", "status-box");
    label.append(box, " ", el("span", "badge status-" + status, status.replace("_", " ")));
    box.addEventListener("change", () => apply(filtersOfForm()));
    boxes.append(label);
  }
  $("filters").addEventListener("submit", (event) => {
    event.preventDefault();
    apply(filtersOfForm());
  });
  for (const id of ["agent", "actor-filter", "thread_id", "schedule", "since", "until"]) {
    $(id).addEventListener("change", () => apply(filtersOfForm()));
  }
  $("only-failed").addEventListener("click", () => {
    const filters = new URLSearchParams();
    filters.append("status", "failed");
    fillForm(filters);
    apply(filters);
  });
  $("clear").addEventListener("click", () => {
    const filters = new URLSearchParams();
    fillForm(filters);
    apply(filters);
  });
  $("more").addEventListener("click", more);
  window.addEventListener("popstate", () => {
    if (location.pathname === "/runs" || location.pathname === "/runs/") {
      const filters = filtersOfAddress();
      fillForm(filters);
      followRuns(filters);
    }
  });
}

// --- the live list --------------------------------------------------------------------

function stopRuns() {
  if (list.live) list.live.stop();
  list.live = null;
}

function followRuns(filters) {
  stopRuns();
  Object.assign(list, { first: [], firstCursor: null, older: [], olderCursor: null, loaded: false, filters });
  $("filter-error").textContent = "";
  renderRuns();
  setStatus("Connecting…");
  const query = filters.toString();
  list.live = follow("/v1/runs/stream" + (query ? "?" + query : ""), {
    onEvent: (doc) => {
      list.first = doc.runs;
      list.firstCursor = doc.next_cursor;
      list.loaded = true;
      renderRuns();
    },
    onStatus: (state, why) => {
      if (state === "live") setStatus("Live: this list updates by itself.");
      else if (state === "reconnecting") setStatus("Reconnecting… (" + why + ")");
      else if (state === "refused") {
        setStatus("");
        $("filter-error").textContent = visible(why);
      }
    },
  });
}

async function more() {
  const cursor = list.older.length ? list.olderCursor : list.firstCursor;
  if (!cursor) return;
  $("more").disabled = true;
  const filters = new URLSearchParams(list.filters);
  filters.set("cursor", cursor);
  try {
    const response = await api("/v1/runs?" + filters.toString());
    let doc = null;
    try {
      doc = await response.json();
    } catch {
      doc = null;
    }
    if (!response.ok) {
      $("filter-error").textContent = visible(said(response, doc));
      return;
    }
    list.older.push(...doc.runs);
    list.olderCursor = doc.next_cursor;
    renderRuns();
  } finally {
    $("more").disabled = false;
  }
}

function renderRuns() {
  const seen = new Set();
  const rows = [];
  for (const run of [...list.first, ...list.older]) {
    if (seen.has(run.run_id)) continue;
    seen.add(run.run_id);
    rows.push(runRow(run));
  }
  $("runs").replaceChildren(...rows);
  $("no-runs").hidden = !list.loaded || rows.length > 0;
  const cursor = list.older.length ? list.olderCursor : list.firstCursor;
  $("more").hidden = !cursor;
}

function runRow(run) {
  const row = el("li", "run-row");
  row.dataset.run = run.run_id;
  row.dataset.status = run.status;
  const head = el("div", "head");
  const name = link(runPath(run.run_id), null, "run-link");
  name.append(el("code", "run", run.run_id));
  head.append(name, " ", el("span", "badge status-" + run.status, run.status.replace("_", " ")));
  const meta = el("div", "meta");
  meta.append(el("span", "agent", run.agent), " · ", el("span", "asker", run.actor), " · ", when(run.created_at));
  if (run.parent_run_id) {
    const parent = link(runPath(run.parent_run_id), null, "parent-link");
    parent.append(el("code", null, run.parent_run_id));
    meta.append(" · delegated by ", parent);
  }
  row.append(head, meta);
  const input = run.input || "";
  const cut = input.length > INPUT_SHOWN ? input.slice(0, INPUT_SHOWN) + " …" : input;
  row.append(el("div", "input", cut));
  if (run.error) {
    const kind = run.error_type ? run.error_type + ": " : "";
    row.append(el("div", "error run-error", kind + run.error));
  }
  return row;
}

// --- the page -------------------------------------------------------------------------

// The run's id from the address: nothing stored is templated into the page.
function runOfAddress() {
  const rest = location.pathname.replace(/^\/runs\/?/, "");
  if (!rest) return null;
  try {
    return decodeURIComponent(rest);
  } catch {
    return rest;
  }
}

function signedIn() {
  const runId = runOfAddress();
  $("runs-view").hidden = runId !== null;
  $("run-view").hidden = runId === null;
  if (runId !== null) {
    showRun(runId);
    return;
  }
  const filters = filtersOfAddress();
  fillForm(filters);
  followRuns(filters);
}

function signedOut() {
  stopRuns();
  leaveRun();
  $("runs").replaceChildren();
}

buildFilters();
start({ view: "console", signedIn, signedOut });
