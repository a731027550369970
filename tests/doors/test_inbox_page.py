"""The approval inbox in a real browser (headless chromium), against the durable stack."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.apps import executed
from tests.support.apps.http import ANSWER
from tests.support.browser import browser_page, screenshot
from tests.support.serve import TOKENS, Stack, open_stack

PAGE_BROKER_DB = 13
MARKUP = "<img src=x onerror=alert(1)>"


@pytest.fixture(scope="module")
def stack(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("inbox")
    with open_stack(pg_url, redis_url, PAGE_BROKER_DB, tmp, "serve-inbox") as made:
        yield made


@pytest.fixture
def page(stack: Stack) -> Iterator[Any]:
    with browser_page() as made:
        made.dialogs = []
        made.on("dialog", lambda dialog: (made.dialogs.append(dialog.message), dialog.dismiss()))
        made.console_errors = []
        made.on(
            "console",
            lambda m: made.console_errors.append(m.text) if m.type == "error" else None,
        )
        made.goto(stack.api.url + "/")
        yield made


def sign_in(page: Any, actor: str) -> None:
    page.fill("#token", TOKENS[actor])
    page.click("#sign-in-form button[type=submit]")
    page.wait_for_selector("#who:not([hidden])")
    assert page.text_content("#actor").startswith(f"Signed in as {actor}")


def test_approve_a_refund_from_the_inbox_and_the_durable_run_completes(
    stack: Stack, page: Any
) -> None:
    sign_in(page, "alice")
    page.wait_for_selector("#status:has-text('Live')")
    # The list updates by itself: a run started now shows up without a reload.
    run_id = stack.start("user-7", text=f"please refund \u202e{MARKUP}")
    item = page.locator(f"li.approval[data-run='{run_id}']")
    item.wait_for()
    assert item.locator(".tool").text_content() == "refund"
    assert item.locator(".run").text_content() == run_id
    assert item.locator(".asker").text_content() == "user-7"
    assert item.locator("time").text_content() in ("just now",) or "ago" in str(
        item.locator("time").text_content()
    )
    # The arguments as stored, shown as text: the markup is characters, not an element.
    args = item.locator("pre.args").text_content()
    # A bidi override shows as its escape: it cannot reorder what the approver reads.
    assert f'"note": "please refund \\u202e{MARKUP}"' in args
    # What the approver judges the call by: the agent, what the run was asked, and what
    # the model said when it asked (all as text).
    assert item.locator(".context .meta").text_content() == "agent support"
    asked = item.locator("blockquote.input").text_content() or ""
    assert asked == f"please refund \\u202e{MARKUP}"
    assert (item.locator("blockquote.said").text_content() or "").strip() == "Refunding."
    assert page.locator("#approvals img").count() == 0
    assert page.locator("img").count() == 0
    screenshot(page, "inbox-pending-refund")

    item.locator("input.reason").fill("customer is right")
    item.locator("button.approve").click()
    item.wait_for(state="detached")  # gone from the list once decided
    decided = page.locator("#decided li").first
    assert re.match(rf"Approved refund \(call_1\) of run {run_id}", decided.text_content() or "")
    stack.doors.wait_status(run_id, "completed")
    assert stack.doors.store.get_run(run_id).output == ANSWER
    call = stack.doors.store.tool_call(run_id, "call_1")
    assert call is not None and (call["decided_by"], call["decision_reason"]) == (
        "alice",
        "customer is right",
    )
    assert executed(run_id).count(("refund", f"{run_id}:tool:call_1")) == 1
    page.wait_for_selector("#no-approvals:not([hidden])")
    screenshot(page, "inbox-after-approval")
    assert page.dialogs == []  # nothing in the arguments ever ran
    assert page.console_errors == []
    # The token is kept in the tab, never put in the address.
    assert TOKENS["alice"] not in page.url
    assert page.evaluate("sessionStorage.getItem('agent-jobs.token')") == TOKENS["alice"]


def test_a_decision_someone_made_first_stays_under_decided_here(stack: Stack, page: Any) -> None:
    """The loser of a decision race saw who decided for a moment, then the item vanished
    with no trace of what became of the call."""
    sign_in(page, "alice")
    page.wait_for_selector("#status:has-text('Live')")
    run_id = stack.start("user-7", text="refund it")
    item = page.locator(f"li.approval[data-run='{run_id}']")
    item.wait_for()
    path = f"/v1/runs/{run_id}/approvals/call_1"

    def carol_first(route: Any) -> None:  # the other lead decides while alice's is on its way
        decided = stack.call("carol", "POST", path, json={"decision": "reject"})
        assert decided.status_code == 200, decided.text
        route.continue_()

    page.route(f"**{path}", carol_first)
    item.locator("button.approve").click()
    entry = page.locator("#decided li").first
    entry.wait_for()
    said = entry.text_content() or ""
    assert said.startswith(f"Not recorded: refund (call_1) of run {run_id}"), said
    assert "already decided: reject by carol" in said
    item.wait_for(state="detached")  # gone from the list, and still said below it
    assert page.locator("#decided li").first.text_content() == said
    stack.doors.wait_status(run_id, "completed")
    assert ("refund", f"{run_id}:tool:call_1") not in executed(run_id)


def test_a_reload_keeps_the_session_and_sign_out_forgets_the_token(stack: Stack, page: Any) -> None:
    sign_in(page, "carol")
    page.reload()
    page.wait_for_selector("#who:not([hidden])")
    assert page.text_content("#actor") == "Signed in as carol (lead)"
    page.click("#sign-out")
    page.wait_for_selector("#sign-in:not([hidden])")
    assert page.evaluate("sessionStorage.getItem('agent-jobs.token')") is None


def test_an_unknown_token_is_refused_on_the_page(stack: Stack, page: Any) -> None:
    page.fill("#token", "not-a-token")
    page.click("#sign-in-form button[type=submit]")
    page.wait_for_selector("#sign-in-error:has-text('not known')")
    assert page.is_hidden("#inbox")
    screenshot(page, "inbox-unknown-token")


def test_answer_a_question_from_the_page(stack: Stack, page: Any) -> None:
    sign_in(page, "user-7")
    run_id = stack.start("user-7", agent="planner", text="book a call")
    item = page.locator(f"li.question[data-run='{run_id}']")
    item.wait_for()
    labels = item.locator("label.asked")
    assert labels.nth(0).text_content() == "Which day suits you?"
    item.locator("input[data-question='q1']").fill("Thursday")
    item.locator("button.send").click()
    assert item.locator(".outcome").text_content() == "Answer every question first."
    item.locator("input[data-question='q2']").fill("Morning")
    screenshot(page, "inbox-question")
    item.locator("button.send").click()
    item.wait_for(state="detached")
    stack.doors.wait_status(run_id, "completed")
    [result] = [c["result"] for c in stack.doors.store.tool_calls(run_id)]
    assert result == "a call booked for Thursday (Morning)"


def test_the_page_runs_no_inline_script_and_says_so(stack: Stack) -> None:
    reply = stack.call(None, "GET", "/")
    assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/html")
    policy = reply.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "unsafe-inline" not in policy
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", reply.text, re.DOTALL)
    assert scripts and all('src="/static/' in attrs and not body.strip() for attrs, body in scripts)
    assert not re.search(r"\son[a-z]+=", reply.text)  # no inline event handlers
    assets = ("app.js", "inbox.js", "console.js", "run.js", "timeline.js", "app.css", "favicon.svg")
    for asset in assets:
        served = stack.call(None, "GET", f"/static/{asset}")
        assert served.status_code == 200 and served.headers["x-content-type-options"] == "nosniff"
        if asset.endswith(".js"):  # modules: served as scripts, writing no markup
            assert served.headers["content-type"].startswith("text/javascript")
            assert "innerHTML" not in served.text and "insertAdjacentHTML" not in served.text
