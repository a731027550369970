"""`GET /`: the approval inbox, a page of plain HTML whose script and style this server serves.

The page holds no data: its script signs in with a token (kept in the tab's
`sessionStorage`, sent as the bearer header), reads `GET /v1/approvals/stream` with
`fetch()` (an `EventSource` cannot send the header, and a token in a URL would end up
in logs and history) and writes every value with `textContent`, never as markup.
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

PAGE = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="referrer" content="no-referrer">
<title>Approval inbox · agent-jobs</title>
<link rel="icon" href="/static/favicon.svg" type="image/svg+xml">
<link rel="stylesheet" href="/static/inbox.css">
<script src="/static/inbox.js" defer></script>
</head>
<body>
<header>
  <h1>Approval inbox</h1>
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
  <section id="inbox" hidden>
    <p id="status" class="status" aria-live="polite"></p>
    <h2>Waiting for your decision <span id="approval-count" class="count"></span></h2>
    <p id="no-approvals" class="empty">Nothing waits for your decision.</p>
    <ul id="approvals" class="items"></ul>
    <h2>Questions for you <span id="question-count" class="count"></span></h2>
    <p id="no-questions" class="empty">No question waits for your answer.</p>
    <ul id="questions" class="items"></ul>
    <h2>Decided here</h2>
    <ul id="decided" class="log"></ul>
  </section>
  <noscript><p>This page needs JavaScript.</p></noscript>
</main>
<footer>agent-jobs {version}</footer>
</body>
</html>
"""


def package_version() -> str:
    try:
        return version("agent-jobs")
    except PackageNotFoundError:
        return "(not installed)"


@router.get("/", response_class=HTMLResponse)
def inbox_page() -> HTMLResponse:
    """The approval inbox (no token needed to load it: it asks for one)."""
    return HTMLResponse(PAGE.replace("{version}", html.escape(package_version())))


def static_files() -> StaticFiles:
    return StaticFiles(directory=STATIC)
