"""Flower's tasks page as a person sees it, in a real browser (headless chromium): Flower
started with the shipped config file, its password holding `@` and `,`."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.operations.test_flower import PASSWORD, USER, Flower
from tests.support.browser import browser_page, screenshot
from tests.support.doors import Doors, open_doors, plain_celery_send
from tests.support.redis_server import RedisServer

WIDE = {"width": 1800, "height": 1000}


@pytest.fixture
def doors(pg_url: str, tmp_path: Path) -> Iterator[Doors]:
    server = RedisServer().start()  # a Redis of its own: no database number to share
    try:
        with open_doors(pg_url, server.url(0), 0, tmp_path) as d:
            yield d
    finally:
        server.close()


def test_the_tasks_page_shows_steps_runs_and_refusals(doors: Doors) -> None:
    assert "@" in PASSWORD and "," in PASSWORD
    flower = Flower(doors)
    doors.worker()
    run_id = doors.client.enqueue_run("w1", "go", actor="user-7")
    refused, marked_up = plain_celery_send(
        doors.broker,
        [
            {"kwargs": {"agent": "w1"}, "queue": "agent_jobs"},  # no input
            {"kwargs": {"agent": "<b>bold</b>", "input": "go"}, "queue": "agent_jobs"},
        ],
    )
    doors.wait_status(run_id, "completed")
    short = run_id[:8] + "…"

    with browser_page(http_credentials={"username": USER, "password": PASSWORD}) as page:
        page.set_viewport_size(WIDE)
        page.goto(flower.url("/tasks"))
        table = page.locator("#tasks-table")
        # The steps of the finished run, each with the run (cut short) and what became
        # of it; the refused run failed, with its reason.
        for text in (
            f"model:1 · run {short}",
            f"tool:call_1 lookup · run {short}",
            f"coordinate · run {short}",
            "done → completed",
            f"start_run w1 · run {refused[:8]}…",
            "refused: invalid run request: input: Field required",
        ):
            table.get_by_text(text, exact=False).first.wait_for()
        refused_row = page.locator("#tasks-table tbody tr", has_text=refused[:8])
        assert "FAILURE" in refused_row.inner_text()
        assert "refused: invalid run request: input: Field required" in refused_row.inner_text()
        assert "'done → completed'" not in table.inner_text()  # the text, not a literal
        # Text that looks like markup is shown as text.
        assert "start_run <b>bold</b>" in table.inner_text()
        assert page.locator("#tasks-table b").count() == 0
        screenshot(page, "flower-tasks")

        # The whole run id finds every task of the run; each task's page shows it whole.
        search = page.locator("#tasks-table_filter input")
        search.fill(run_id)
        page.wait_for_function(
            "n => document.querySelectorAll('#tasks-table tbody tr').length === n", arg=8
        )
        rows = page.locator("#tasks-table tbody tr").all_inner_texts()
        assert all(f"run {short}" in row for row in rows), rows
        assert sum("agent_jobs.model_turn" in row for row in rows) == 3
        last = page.locator("#tasks-table tbody tr", has_text=f"model:3 · run {short}")
        last.locator("a[href*='/task/']").click()
        page.wait_for_url(re.compile(r".*/task/.+"))
        body = page.locator("body").inner_text()
        assert run_id in body and "'step': 'model:3'" in body
        assert "SUCCESS" in body and "done → completed" in body
        screenshot(page, "flower-task")

    # A wrong password is turned away.
    for password in ("wrong", PASSWORD.split(",")[0], PASSWORD.split("@")[0]):
        with browser_page(http_credentials={"username": USER, "password": password}) as page:
            reply = page.goto(flower.url("/tasks"))
            assert reply is not None and reply.status == 401
    del marked_up
