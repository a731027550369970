"""A real browser for the page tests: Debian's chromium, headless, driven by Playwright.

`.ci/run` installs chromium from Debian's packages; Playwright never downloads a browser
of its own here. A missing chromium fails the test that needs it, never skips it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = os.environ.get("AGENT_JOBS_TEST_CHROMIUM", "/usr/bin/chromium")
# No connection to the outside world: the machine's network is closed, and a browser
# that tries (updates, sync, field trials) is slow to start and noisy in its log.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
]
# Where a page test leaves its screenshots (CI keeps the folder as the tests' artifacts).
ARTIFACTS = Path(os.environ.get("AGENT_JOBS_TEST_ARTIFACTS", "test-artifacts"))


@contextmanager
def browser_page(
    *, http_credentials: dict[str, str] | None = None, timeout: float = 20.0
) -> Iterator[Any]:
    """A fresh page in a fresh headless chromium (its own profile), closed afterwards."""
    if shutil.which(CHROMIUM) is None and not Path(CHROMIUM).exists():
        pytest.fail(f"the page tests need chromium at {CHROMIUM} (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        try:
            context = browser.new_context(http_credentials=http_credentials)  # type: ignore[arg-type]
            context.set_default_timeout(timeout * 1000)
            page = context.new_page()
            yield page
            context.close()
        finally:
            browser.close()


def screenshot(page: Any, name: str) -> Path:
    """Save the page as `<ARTIFACTS>/<name>.png`; returns the path."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path
