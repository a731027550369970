"""The pages: the approval inbox (`GET /`) and the runs console (`GET /runs`, a run's page
`GET /runs/{run_id}`), two views of one small app whose script and style this server
serves.

A page holds no data, and nothing stored is templated into it (the run page's script
reads the run's id from its address): its script signs in with a token (kept in the
tab's `sessionStorage`, sent as the bearer header), reads the API's event streams with
`fetch()` (an `EventSource` cannot send the header, and a token in a URL would end up in
logs and history) and writes every value with `textContent`, never as markup. The
scripts are ES modules: `app.js` holds what both views share.
"""

from __future__ import annotations

import html
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

STATIC = Path(__file__).parent / "static"
router = APIRouter(include_in_schema=False)

SHELL = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>{title} · agent-jobs</title>
<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/static/app.css">
<script type="module" src="/static/{script}"></script>
</head>
<body class="{script_name}">
<header>
  <h1>{title}</h1>
  <nav aria-label="Views">
    <a href="/"{inbox_current}>Inbox</a> · <a href="/runs"{runs_current}>Runs</a>
  </nav>
  <div id="who" hidden>
    <span id="actor"></span>
    <button id="sign-out" type="button">Sign out</button>
  </div>
</header>
<main>
  <section id="sign-in" hidden>
    <form id="sign-in-form" autocomplete="off">
      <label for="token">API token</label>
      <input id="token" type="password" autocomplete="off" spellcheck="false" required>
      <button type="submit">Sign in</button>
    </form>
    <p id="sign-in-error" class="error" role="alert"></p>
    <p class="hint">The token stays in this tab and goes to this server only, as the
      <code>Authorization</code> header.</p>
  </section>
{body}
  <noscript><p>This page needs JavaScript.</p></noscript>
</main>
<footer>agent-jobs {version}</footer>
</body>
</html>
"""

INBOX = """  <section id="inbox" hidden>
    <p id="status" class="status" aria-live="polite"></p>
    <h2>Waiting for your decision <span id="approval-count" class="count"></span></h2>
    <p id="no-approvals" class="empty">Nothing waits for your decision.</p>
    <ul id="approvals" class="items"></ul>
    <h2>Questions for you <span id="question-count" class="count"></span></h2>
    <p id="no-questions" class="empty">No question waits for your answer.</p>
    <ul id="questions" class="items"></ul>
    <h2>Decided here</h2>
    <ul id="decided" class="log"></ul>
  </section>"""

CONSOLE = """  <section id="console" hidden>
    <p id="status" class="status" aria-live="polite"></p>
    <div id="runs-view" hidden>
      <form id="filters" class="filters" autocomplete="off">
        <div class="search">
          <input id="q" name="q" type="search" maxlength="200"
            placeholder="Search run ids, inputs, metadata" aria-label="Search">
          <button type="submit">Search</button>
        </div>
        <fieldset id="statuses" class="statuses"><legend>Status</legend></fieldset>
        <div class="fields">
          <label>Agent <input id="agent" name="agent" maxlength="200"></label>
          <label>Actor <input id="actor-filter" name="actor" maxlength="200"></label>
          <label>Thread <input id="thread_id" name="thread_id" maxlength="64"></label>
          <label>Schedule <input id="schedule" name="schedule" maxlength="64"></label>
          <label>Since <input id="since" name="since" type="datetime-local" step="1"></label>
          <label>Until <input id="until" name="until" type="datetime-local" step="1"></label>
        </div>
        <div class="buttons">
          <button id="only-failed" type="button">Failed runs</button>
          <button id="clear" type="button">Clear filters</button>
        </div>
      </form>
      <p id="filter-error" class="error" role="alert"></p>
      <p id="no-runs" class="empty" hidden>No run you may see matches.</p>
      <ul id="runs" class="runs"></ul>
      <button id="more" type="button" hidden>More</button>
    </div>
    <div id="run-view" hidden>
      <p id="run-missing" class="error" hidden>No such run (or not one you may see).</p>
      <article id="run" hidden>
        <h2><code id="run-id"></code> <span id="run-status" class="badge"></span></h2>
        <dl id="facts" class="facts"></dl>
        <div id="controls" class="controls"></div>
        <div id="fork" class="panel" hidden>
          <label>Fork at step <select id="fork-at"></select></label>
          <button id="fork-preview" type="button">Preview</button>
          <div id="fork-plan" hidden></div>
        </div>
        <p id="control-outcome" class="outcome" role="status"></p>
        <div id="waiting"></div>
        <h3>Input</h3>
        <pre id="run-input" class="text"></pre>
        <div id="result"></div>
        <h3>Live text <span id="live-state" class="count"></span></h3>
        <pre id="live-text" class="text"></pre>
        <div id="drafts" class="drafts" hidden></div>
        <h3>Timeline <span id="span" class="count"></span></h3>
        <ol id="timeline" class="timeline"></ol>
        <h3>Decisions</h3>
        <p id="no-decisions" class="empty">No call of this run was decided.</p>
        <ul id="decisions" class="log"></ul>
        <div id="tree-part" hidden>
          <h3>Delegated runs</h3>
          <div id="tree" class="tree"></div>
        </div>
      </article>
    </div>
  </section>"""


def package_version() -> str:
    try:
        return version("agent-jobs")
    except PackageNotFoundError:
        return "(not installed)"


def page(title: str, script: str, body: str) -> HTMLResponse:
    """A view in the shell: the header links both views, the current one marked."""
    current = ' aria-current="page"'
    filled = (
        SHELL.replace("{title}", title)
        .replace("{script}", script)
        .replace("{script_name}", script.removesuffix(".js"))
        .replace("{inbox_current}", current if script == "inbox.js" else "")
        .replace("{runs_current}", current if script == "console.js" else "")
        .replace("{body}", body)
    )
    return HTMLResponse(filled.replace("{version}", html.escape(package_version())))


@router.get("/", response_class=HTMLResponse)
def inbox_page() -> HTMLResponse:
    """The approval inbox (no token needed to load it: it asks for one)."""
    return page("Approval inbox", "inbox.js", INBOX)


@router.get("/runs", response_class=HTMLResponse)
def runs_page() -> HTMLResponse:
    """The runs console's list (no token needed to load it: it asks for one)."""
    return page("Runs", "console.js", CONSOLE)


@router.get("/runs/{run_id:path}", response_class=HTMLResponse)
def run_page(run_id: str) -> HTMLResponse:
    """A run's page: the console's page as it is; its script reads the run's id from the
    address and asks the API, which says whether the caller may see the run."""
    return page("Runs", "console.js", CONSOLE)


def static_files() -> StaticFiles:
    return StaticFiles(directory=STATIC)
