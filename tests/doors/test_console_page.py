"""The runs console in a real browser (headless chromium), against the durable stack:
workers, beat, the approvals listener and `agent-jobs serve` on the console's test app
(tests/support/apps/console.py, the HTTP API's app with a few agents more).

Every wait is for something the page shows (a selector, an attribute) or for the store;
no test bounds how long anything took.
"""

from __future__ import annotations

import json
import os
import re
import signal
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from tests.support.apps import executed, open_gate
from tests.support.apps.console import HELD_ARGS, HELD_WORDS, TICK
from tests.support.apps.http import ANSWER
from tests.support.browser import browser_page, screenshot
from tests.support.doors import approval, signed
from tests.support.serve import TOKENS, Stack, open_stack
from tests.support.waiting import eventually

CONSOLE_BROKER_DB = 15
APP = "tests.support.apps.console:app"
MARKUP = "<img src=x onerror=alert(1)>"
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="module")
def stack(pg_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("console")
    # Two workers and beat: one killed inside an action leaves the other to recover it.
    with open_stack(
        pg_url, redis_url, CONSOLE_BROKER_DB, tmp, "serve-console", app=APP, workers=2
    ) as made:
        made.doors.beat()
        made.doors.start_listener()
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
        made.page_errors = []
        made.on("pageerror", lambda error: made.page_errors.append(str(error)))
        yield made
        assert made.dialogs == []  # nothing stored ever ran
        assert made.page_errors == []


def tagged(words: str) -> tuple[str, str]:
    """(a tag no other run's input holds, `words` with it): what a search finds alone."""
    tag = f"t{uuid.uuid4().hex[:10]}"
    return tag, f"{tag} {words}"


def open_as(page: Any, stack: Stack, actor: str, path: str) -> None:
    """Open `path` and sign in as `actor` (the token stays in the tab: later pages of the
    same tab are signed in; another actor's session is signed out first)."""
    page.goto(stack.api.url + path)
    page.wait_for_selector("#who:not([hidden]), #sign-in:not([hidden])")
    if page.is_visible("#who"):
        if page.text_content("#actor").startswith(f"Signed in as {actor}"):
            return
        page.click("#sign-out")
    page.fill("#token", TOKENS[actor])
    page.click("#sign-in-form button[type=submit]")
    page.wait_for_selector("#who:not([hidden])")
    assert page.text_content("#actor").startswith(f"Signed in as {actor}")


def visit(page: Any, stack: Stack, path: str) -> None:
    page.goto(stack.api.url + path)
    page.wait_for_selector("#who:not([hidden])")


def row(page: Any, run_id: str) -> Any:
    return page.locator(f"li.run-row[data-run='{run_id}']")


def shows(page: Any, run_ids: list[str]) -> None:
    """Wait for the list to show these runs, in this order, and no other."""
    page.wait_for_function(
        "ids => JSON.stringify([...document.querySelectorAll('li.run-row')]"
        ".map(r => r.dataset.run)) === JSON.stringify(ids)",
        arg=run_ids,
    )


def status_is(page: Any, status: str) -> None:
    page.wait_for_selector(f"#run[data-status='{status}']")


def approve(stack: Stack, run_id: str, actor: str = "alice", reason: str | None = None) -> None:
    body: dict[str, Any] = {"decision": "approve"}
    if reason is not None:
        body["reason"] = reason
    reply = stack.call(actor, "POST", f"/v1/runs/{run_id}/approvals/call_1", json=body)
    assert reply.status_code == 200, reply.text


def refunded(stack: Stack, text: str, reason: str = "within policy") -> str:
    """A support run of user-7's whose refund alice approved, completed."""
    run_id = stack.start("user-7", text=text)
    stack.doors.wait_status(run_id, "awaiting_approval")
    approve(stack, run_id, reason=reason)
    stack.doors.wait_status(run_id, "completed")
    return run_id


def test_the_list_filters_follows_and_pages_runs(stack: Stack, page: Any) -> None:
    tag, words = tagged("chat about an order")
    chat = stack.start("user-7", agent="chat", text=words)
    broken = stack.start("user-7", agent="broken", text=f"{tag} break it")
    stack.doors.wait_status(chat, "completed")
    failed = stack.doors.wait_status(broken, "failed")
    assert failed.error
    open_as(page, stack, "olga", f"/runs?q={tag}")
    page.wait_for_selector("#status:has-text('Live')")
    shows(page, [broken, chat])  # newest first
    assert row(page, chat).locator(".input").text_content() == words
    assert row(page, chat).get_attribute("data-status") == "completed"
    # A failed run says why in its row.
    error = row(page, broken).locator(".run-error").text_content() or ""
    assert failed.error in error and (failed.error_type or "") in error

    # The list follows: a run that starts shows up without a reload, and moves on.
    asking = stack.start("user-7", text=f"{tag} refund it")
    row(page, asking).wait_for()
    page.wait_for_selector(f"li.run-row[data-run='{asking}'][data-status='awaiting_approval']")
    shows(page, [asking, broken, chat])
    screenshot(page, "console-runs")

    # Failed runs are one click away, with their error; the filter is in the address.
    page.click("#only-failed")
    # Every failed run the operator may read (other tests' too, in the same database):
    # this one among them, and no run of another status.
    page.wait_for_function(
        "id => { const rows = [...document.querySelectorAll('li.run-row')];"
        " return rows.some(r => r.dataset.run === id)"
        " && rows.every(r => r.dataset.status === 'failed'); }",
        arg=broken,
    )
    assert "status=failed" in page.url and f"q={tag}" not in page.url
    page.fill("#q", tag)
    page.click("#filters button[type=submit]")
    page.wait_for_url(re.compile(f"q={tag}"))
    page.reload()
    shows(page, [broken])
    assert page.is_checked("#statuses input[value='failed']")
    assert page.input_value("#q") == tag
    screenshot(page, "console-runs-failed")

    # A window of time: none of them was created in the next millennium.
    page.fill("#since", "2999-01-01T00:00:00")
    page.dispatch_event("#since", "change")
    page.wait_for_selector("#no-runs:not([hidden])")
    assert "since=2999-" in page.url

    # By agent, from the form.
    page.click("#clear")
    page.fill("#q", tag)
    page.fill("#agent", "chat")
    page.click("#filters button[type=submit]")
    shows(page, [chat])

    # By schedule: the runs whose metadata names it (a schedule's runs carry its name).
    scheduled = stack.start(
        "user-7", agent="chat", text=f"{tag} on time", metadata={"schedule": f"s-{tag}"}
    )
    stack.doors.wait_status(scheduled, "completed")
    page.click("#clear")
    page.fill("#schedule", f"s-{tag}")
    page.dispatch_event("#schedule", "change")
    shows(page, [scheduled])
    assert f"schedule=s-{tag}" in page.url
    page.reload()
    shows(page, [scheduled])
    assert page.input_value("#schedule") == f"s-{tag}"

    # Older runs a page at a time, by the list's cursor.
    visit(page, stack, f"/runs?q={tag}&limit=2")
    shows(page, [scheduled, asking])
    page.click("#more")
    shows(page, [scheduled, asking, broken, chat])
    assert page.is_hidden("#more")

    # Each row is a link to the run's page.
    row(page, chat).locator("a.run-link").click()
    page.wait_for_url(f"**/runs/{chat}")
    status_is(page, "completed")
    assert page.console_errors == []


def test_a_runs_page_shows_its_timeline_input_result_and_who_decided(
    stack: Stack, page: Any
) -> None:
    text = f"please refund \u202e{MARKUP}"
    run_id = refunded(stack, text, reason="customer is right")
    steps = stack.call("user-7", "GET", f"/v1/runs/{run_id}/steps").json()["steps"]
    open_as(page, stack, "user-7", f"/runs/{run_id}")
    status_is(page, "completed")
    assert page.text_content("#run-id") == run_id
    # Stored text is text: the markup is characters, a bidi override its escape.
    assert page.text_content("#run-input") == f"please refund \\u202e{MARKUP}"
    assert page.text_content("#result .output") == ANSWER
    assert page.locator("img").count() == 0

    # The waterfall: a row a step, in order, each bar placed within the run's span.
    page.wait_for_function(
        f"document.querySelectorAll('#timeline li.step').length === {len(steps)}"
    )
    shown = page.eval_on_selector_all("#timeline li.step", "rows => rows.map(r => r.dataset.step)")
    assert shown == [s["step"] for s in steps]
    bars = page.eval_on_selector_all(
        "#timeline .bar",
        "bars => bars.map(b => [parseFloat(b.style.left), parseFloat(b.style.width)])",
    )
    assert len(bars) == len([s for s in steps if s["started_at"]])
    assert min(left for left, _ in bars) == 0
    assert all(0 <= left <= 100 and 0 < width <= 100 for left, width in bars)
    assert max(left + width for left, width in bars) == pytest.approx(100, abs=0.5)
    refund = page.locator("li.step[data-step='tool:call_1']")
    assert refund.locator(".name").text_content() == "refund (call_1)"
    assert refund.locator(".took").text_content()  # its duration

    # A click shows a step's input and result, as text.
    assert refund.locator(".details").is_hidden()
    refund.locator(".step-head").click()
    intent = json.loads(refund.locator("pre.intent").text_content() or "null")
    assert json.dumps(intent).count("please refund") == 1
    result = json.loads(refund.locator("pre.result").text_content() or "null")
    assert result["result"] == {"order_id": "42", "refunded": 5}
    assert refund.locator(".details .worker").text_content()

    # Who decided the call, when, and why: on its step and in the decisions.
    [approval] = [s for s in steps if s["kind"] == "approval"]
    decided = page.locator(f"li.step[data-step='{approval['step']}']")
    assert decided.locator(".step-head .decider").text_content() == "by alice"
    decision = page.locator("#decisions li.decision[data-call='call_1']")
    assert decision.locator(".decider").text_content() == "alice"
    assert decision.locator(".verdict").text_content() == "approve"
    assert decision.locator(".reason").text_content() == "customer is right"
    assert decision.locator("time").get_attribute("datetime")
    # The run's actor may fork it; it has ended, so there is nothing to pause or cancel.
    assert page.locator("#controls button.control").count() == 0
    assert page.is_visible("#fork")
    screenshot(page, "console-run")
    assert page.console_errors == []


def test_a_runs_delegated_runs_show_as_a_tree_of_links(stack: Stack, page: Any) -> None:
    office = stack.start("user-7", agent="office", text="delegate it")
    stack.doors.wait_status(office, "completed")
    tree = stack.call("user-7", "GET", f"/v1/runs?root_run_id={office}").json()["runs"]
    [desk] = [r["run_id"] for r in tree if r["parent_run_id"] == office]
    [chat] = [r["run_id"] for r in tree if r["parent_run_id"] == desk]
    open_as(page, stack, "user-7", f"/runs/{office}")
    status_is(page, "completed")
    page.wait_for_selector("#tree-part:not([hidden])")
    nested = f"#tree li[data-run='{office}'] li[data-run='{desk}'] li[data-run='{chat}']"
    page.wait_for_selector(nested)
    assert page.get_attribute(f"#tree li[data-run='{office}'] > a", "aria-current") == "page"
    # The step that delegated links to the run it started.
    child = page.locator("li.step[data-kind='child']")
    child.locator(".step-head").click()
    assert child.locator("a.child-link").text_content() == desk
    # Each run of the tree is a link to its page, which names the run above it.
    page.click(f"#tree li[data-run='{chat}'] > a")
    page.wait_for_url(f"**/runs/{chat}")
    status_is(page, "completed")
    assert page.text_content("#facts a.run-link") == desk
    page.wait_for_selector(f"#tree li[data-run='{chat}'] > a[aria-current='page']")
    assert page.text_content("#result .output") == "just words, no tools"
    assert page.console_errors == []


def test_a_running_runs_text_arrives_on_its_page(stack: Stack, page: Any) -> None:
    run_id = stack.start("user-7", agent="held_talker", text="tell me slowly")
    open_as(page, stack, "user-7", f"/runs/{run_id}")
    first = HELD_WORDS.split(" ")[0]
    page.wait_for_selector(f"#live-text:has-text('{first}')")
    # The rest does not exist yet: the model holds it until the gate opens.
    assert page.text_content("#live-text") == first + " "
    status_is(page, "running")
    screenshot(page, "console-run-streaming")
    open_gate(run_id)
    page.wait_for_selector("#live-text:has-text('one entry at a time.')")
    status_is(page, "completed")
    assert page.text_content("#live-text") == HELD_WORDS + "Order 42 was looked up."
    assert page.text_content("#result .output") == "Order 42 was looked up."
    assert page.console_errors == []


def test_a_calls_arguments_are_shown_as_written_then_as_called(stack: Stack, page: Any) -> None:
    run_id = stack.start("user-7", agent="held_writer", text="refund order 42")
    open_as(page, stack, "user-7", f"/runs/{run_id}")
    draft = page.locator("#drafts .draft[data-call='call_w']")
    draft.wait_for()
    # The first piece is on the page while the second does not exist yet.
    assert draft.locator(".draft-args").text_content() == HELD_ARGS[0]
    assert draft.locator(".draft-name").text_content() == "refund"
    assert draft.locator(".draft-state").text_content() == "writing…"
    assert page.text_content("#live-text") == "Refunding. "
    status_is(page, "running")
    screenshot(page, "console-run-writing-arguments")
    open_gate(run_id)
    # The call as recorded replaces what was being written.
    page.wait_for_selector("#drafts .draft.called[data-call='call_w']")
    assert draft.locator(".draft-state").text_content() == "called · pending_approval"
    shown = json.loads(draft.locator(".draft-args").text_content() or "")
    assert shown == json.loads(HELD_ARGS[0] + HELD_ARGS[1])
    assert page.locator("img").count() == 0  # the note's markup is text
    status_is(page, "awaiting_approval")
    assert page.locator("#drafts .draft").count() == 1
    assert page.console_errors == []


def test_approve_a_call_on_the_runs_page_and_the_run_completes(stack: Stack, page: Any) -> None:
    run_id = stack.start("user-7", text=f"refund {MARKUP}")
    stack.doors.wait_status(run_id, "awaiting_approval")
    open_as(page, stack, "alice", f"/runs/{run_id}")
    status_is(page, "awaiting_approval")
    item = page.locator("#waiting .item.approval[data-call='call_1']")
    assert f'"note": "refund {MARKUP}"' in (item.locator("pre.args").text_content() or "")
    assert page.locator("img").count() == 0
    screenshot(page, "console-run-approval")
    item.locator("input.reason").fill("checked the order")
    item.locator("button.approve").click()
    status_is(page, "completed")
    item.wait_for(state="detached")
    decision = page.locator("#decisions li.decision[data-call='call_1']")
    assert decision.locator(".decider").text_content() == "alice"
    assert decision.locator(".reason").text_content() == "checked the order"
    call = stack.doors.store.tool_call(run_id, "call_1")
    assert call is not None
    assert (call["decided_by"], call["decision_reason"]) == ("alice", "checked the order")
    assert executed(run_id).count(("refund", f"{run_id}:tool:call_1")) == 1
    assert page.console_errors == []


def test_a_decision_sent_on_the_redis_channel_shows_on_the_open_page(
    stack: Stack, page: Any
) -> None:
    run_id = stack.start("user-7", text="refund by message")
    stack.doors.wait_status(run_id, "awaiting_approval")
    open_as(page, stack, "user-7", f"/runs/{run_id}")
    status_is(page, "awaiting_approval")
    waiting = page.locator("#waiting .item.approval[data-call='call_1']")
    waiting.wait_for()
    # The page's actor may not decide: the call is shown, with no buttons to press.
    assert waiting.locator("button.approve").count() == 0
    message = approval(run_id, "call_1", reason="sent from the channel")
    assert stack.doors.publish(signed(message)) >= 1  # the listener hears it
    status_is(page, "completed")
    decision = page.locator("#decisions li.decision[data-call='call_1']")
    assert decision.locator(".decider").text_content() == "alice"
    assert decision.locator(".reason").text_content() == "sent from the channel"
    assert page.console_errors == []


def test_answer_a_runs_questions_on_its_page(stack: Stack, page: Any) -> None:
    run_id = stack.start("user-7", agent="planner", text="book a call")
    stack.doors.wait_status(run_id, "awaiting_answers")
    open_as(page, stack, "user-7", f"/runs/{run_id}")
    item = page.locator("#waiting .item.question")
    item.wait_for()
    assert item.locator("label.asked").nth(0).text_content() == "Which day suits you?"
    item.locator("input[data-question='q1']").fill("Thursday")
    item.locator("input[data-question='q2']").fill("Morning")
    item.locator("button.send").click()
    status_is(page, "completed")
    item.wait_for(state="detached")
    [result] = [c["result"] for c in stack.doors.store.tool_calls(run_id)]
    assert result == "a call booked for Thursday (Morning)"
    assert page.console_errors == []


def test_an_operator_pauses_and_resumes_a_run_from_its_page(stack: Stack, page: Any) -> None:
    run_id = stack.start("user-7", agent="held_talker", text="take your time")
    open_as(page, stack, "olga", f"/runs/{run_id}")
    page.wait_for_selector("#live-text:not(:empty)")  # its model step is under way
    page.click("#controls button.pause")
    page.wait_for_selector("#control-outcome:has-text('Pause asked')")
    page.locator("#controls button.pause").wait_for(state="detached")
    assert stack.doors.store.get_run(run_id).pause_requested_by == "olga"
    open_gate(run_id)  # the step ends; the pause takes hold at the boundary after it
    status_is(page, "paused")
    page.wait_for_selector("#facts dt:text-is('pause')")
    screenshot(page, "console-run-paused")
    page.click("#controls button.resume")
    status_is(page, "completed")
    assert stack.doors.store.get_run(run_id).output == "Order 42 was looked up."
    page.wait_for_selector("#facts dt:text-is('resume')")
    assert page.console_errors == []


def test_retry_a_failed_run_and_cancel_a_waiting_one_from_their_pages(
    stack: Stack, page: Any
) -> None:
    broken = stack.start("user-7", agent="broken", text="fail for me")
    stack.doors.wait_status(broken, "failed")
    open_as(page, stack, "olga", f"/runs/{broken}")
    status_is(page, "failed")
    assert "provider says auth" in (page.text_content("#result .run-error") or "")
    page.click("#controls button.retry")
    page.wait_for_selector("#control-outcome:has-text('Retrying')")
    page.wait_for_selector("#facts dt:text-is('retry')")  # who retried it, and when
    status_is(page, "failed")  # the provider refuses it again
    asking = stack.start("user-7", text="refund, then never mind")
    stack.doors.wait_status(asking, "awaiting_approval")
    visit(page, stack, f"/runs/{asking}")
    status_is(page, "awaiting_approval")
    cancel = page.locator("#controls button.cancel")
    cancel.click()  # asked twice: it cannot be taken back
    assert cancel.text_content() == "Really cancel?"
    assert stack.doors.store.get_run(asking).status == "awaiting_approval"
    cancel.click()
    status_is(page, "cancelled")
    page.locator("#controls button.cancel").wait_for(state="detached")
    assert page.console_errors == []


def test_fork_at_a_step_after_a_preview_and_follow_the_new_run(stack: Stack, page: Any) -> None:
    run_id = refunded(stack, "refund once more")
    open_as(page, stack, "user-7", f"/runs/{run_id}")
    status_is(page, "completed")
    model = page.locator("li.step[data-step='model:1']")
    model.locator(".step-head").click()
    model.locator("button.fork-here").click()
    # The preview says which side effects would run again before anything is written.
    again = page.locator("#fork-plan ul.runs-again li")
    again.first.wait_for()
    assert [t.strip() for t in again.all_text_contents()] == ["refund (call_1) at tool:call_1"]
    assert "refund (call_1)" in (page.text_content("#fork-plan ul.asked-again") or "")
    screenshot(page, "console-run-fork-preview")
    page.click("#fork-plan button.fork-confirm")
    page.wait_for_url(re.compile(r"/runs/(?!" + re.escape(run_id) + r"$)[^/]+$"))
    forked = page.url.rsplit("/", 1)[1]
    assert forked != run_id
    # The new run asks for the refund again: a fork inherits no decision.
    status_is(page, "awaiting_approval")
    page.wait_for_selector("#waiting .item.approval[data-call='call_1']")
    assert stack.doors.store.get_run(forked).status == "awaiting_approval"
    assert page.console_errors == []


def test_reconcile_a_call_whose_outcome_is_unknown_on_its_page(stack: Stack, page: Any) -> None:
    run_id = stack.start("user-7", agent="payer", text="pay A1")
    stack.doors.wait_status(run_id, "awaiting_approval")
    approve(stack, run_id)
    starts = eventually(
        lambda: [w for w, _ in executed(run_id) if w.startswith("pay:start:")],
        what="pay to have begun",
    )
    os.kill(int(starts[0].rsplit(":", 1)[1]), signal.SIGKILL)  # inside the handler
    stack.doors.wait_status(run_id, "awaiting_reconcile")
    open_as(page, stack, "alice", f"/runs/{run_id}")
    status_is(page, "awaiting_reconcile")
    item = page.locator("#waiting .item.unknown[data-call='call_1']")
    assert item.locator(".key").text_content() == f"{run_id}:tool:call_1"
    screenshot(page, "console-run-outcome-unknown")
    item.locator("textarea.result").fill("{not json")
    item.locator("button.succeeded").click()
    item.locator(".outcome:has-text('not JSON')").wait_for()
    assert stack.doors.store.get_run(run_id).status == "awaiting_reconcile"  # nothing sent
    item.locator("textarea.result").fill('{"paid": "A1"}')
    item.locator("button.succeeded").click()
    status_is(page, "completed")
    item.wait_for(state="detached")
    assert [w for w, _ in executed(run_id) if w.startswith("pay")] == starts  # never again
    assert page.console_errors == []


def test_a_sleeping_run_is_listed_as_such_says_when_it_wakes_and_wakes_on_a_message(
    stack: Stack, page: Any
) -> None:
    run_id = stack.start("user-7", agent="sleeper", text=json.dumps({"seconds": 3600}))
    wake_at = stack.doors.wait_status(run_id, "sleeping").wake_at
    assert wake_at is not None
    # The list's `sleeping` filter, from the form: the sleeper is there (found by its id).
    open_as(page, stack, "olga", f"/runs?q={run_id}")
    shows(page, [run_id])
    page.check("#statuses input[value='sleeping']")
    page.click("#filters button[type=submit]")
    page.wait_for_url(re.compile("status=sleeping"))
    shows(page, [run_id])
    assert row(page, run_id).get_attribute("data-status") == "sleeping"

    # Its page: sleeping, until when, and the sleep on its timeline.
    row(page, run_id).locator("a.run-link").click()
    page.wait_for_url(f"**/runs/{run_id}")
    status_is(page, "sleeping")
    wakes = page.locator("#facts dt:text-is('wakes') + dd time")
    shown = wakes.get_attribute("datetime") or ""
    assert datetime.fromisoformat(shown) == wake_at
    assert "sleeping until" in (page.text_content("#facts .waiting-on") or "")
    page.locator("li.step[data-kind='timer'][data-step='timer:nap']").wait_for()
    screenshot(page, "console-run-sleeping")

    # A message wakes it: the open page follows it to the end, and no longer says it wakes.
    said = stack.call("user-7", "POST", f"/v1/runs/{run_id}/messages", json={"text": "wake"})
    assert said.status_code == 202, said.text
    status_is(page, "completed")
    page.locator("#facts dt:text-is('wakes')").wait_for(state="detached")
    assert json.loads(page.text_content("#result .output") or "")["messages"] == ["wake"]
    assert page.console_errors == []


def test_a_scheduled_runs_page_opens_from_its_link_with_its_timeline(
    stack: Stack, page: Any
) -> None:
    def ticked() -> str | None:
        reply = stack.call("olga", "GET", "/v1/runs", params={"schedule": TICK})
        done = [r["run_id"] for r in reply.json()["runs"] if r["status"] == "completed"]
        return done[0] if done else None

    run_id = eventually(ticked, what=f"a completed run of the schedule {TICK}")
    assert run_id.startswith(f"sched:{TICK}:")  # colons in the id, and so in its address
    steps = stack.call("olga", "GET", f"/v1/runs/{run_id}/steps").json()["steps"]
    open_as(page, stack, "olga", f"/runs?schedule={TICK}")
    row(page, run_id).wait_for()
    link = row(page, run_id).locator("a.run-link")
    assert link.get_attribute("href") == "/runs/" + run_id.replace(":", "%3A")
    link.click()
    page.wait_for_url(re.compile(re.escape("/runs/" + run_id.replace(":", "%3A")) + "$"))
    status_is(page, "completed")
    assert page.text_content("#run-id") == run_id
    page.wait_for_function(
        f"document.querySelectorAll('#timeline li.step').length === {len(steps)}"
    )
    shown = page.eval_on_selector_all("#timeline li.step", "rows => rows.map(r => r.dataset.step)")
    assert shown == [s["step"] for s in steps]
    assert page.text_content("#result .output") == "just words, no tools"
    # Typed with its colons as they are, the address opens the same run.
    visit(page, stack, f"/runs/{run_id}")
    status_is(page, "completed")
    assert page.text_content("#run-id") == run_id
    assert page.console_errors == []


def test_a_run_one_may_not_see_is_not_listed_and_its_page_is_not_found(
    stack: Stack, page: Any
) -> None:
    tag, words = tagged("mine alone")
    run_id = stack.start("user-7", agent="chat", text=words)
    stack.doors.wait_status(run_id, "completed")
    for actor in ("eve", "bob"):
        open_as(page, stack, actor, f"/runs?q={tag}")
        page.wait_for_selector("#no-runs:not([hidden])")
        assert page.locator("li.run-row").count() == 0
        visit(page, stack, f"/runs/{run_id}")
        page.wait_for_selector("#run-missing:not([hidden])")
        assert page.text_content("#run-missing") == "No such run (or not one you may see)."
        assert page.is_hidden("#run")
        assert words not in page.content()
    screenshot(page, "console-run-not-found")
    # Its own actor sees it, in the list and on its page.
    open_as(page, stack, "user-7", f"/runs?q={tag}")
    row(page, run_id).wait_for()


def test_the_console_at_a_phones_width(stack: Stack, page: Any) -> None:
    tag, words = tagged(f"a long question {MARKUP} " + "word " * 60)
    run_id = refunded(stack, words)
    page.set_viewport_size(PHONE)
    open_as(page, stack, "user-7", f"/runs?q={tag}")
    row(page, run_id).wait_for()
    wide = "document.documentElement.scrollWidth"
    assert page.evaluate(wide) <= PHONE["width"]
    screenshot(page, "console-runs-phone")
    row(page, run_id).locator("a.run-link").click()
    status_is(page, "completed")
    page.locator("li.step[data-step='tool:call_1'] .step-head").click()
    assert page.evaluate(wide) <= PHONE["width"]
    screenshot(page, "console-run-phone")


def test_the_console_pages_template_nothing_and_run_no_inline_script(stack: Stack) -> None:
    for path in ("/runs", "/runs/%3Cscript%3Ealert(1)%3C%2Fscript%3E", "/runs/some-run"):
        reply = stack.call(None, "GET", path)
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/html")
        policy = reply.headers["content-security-policy"]
        assert "script-src 'self'" in policy and "unsafe-inline" not in policy
        assert "alert(" not in reply.text and "some-run" not in reply.text
        scripts = re.findall(r"<script([^>]*)>(.*?)</script>", reply.text, re.DOTALL)
        assert scripts == [(' type="module" src="/static/console.js"', "")]
        assert not re.search(r"\s(on[a-z]+|style)=", reply.text)
        assert '<a href="/">Inbox</a>' in reply.text and 'href="/runs" aria-current' in reply.text
