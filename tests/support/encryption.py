"""Encryption at rest for the whole suite: `AGENT_JOBS_TEST_ENCRYPTION=1` gives this
process and every process a test starts a master key, so every store a test builds
seals its payloads (docs/security.md, "Encryption at rest")."""

from __future__ import annotations

import base64
import os

SWITCH = "AGENT_JOBS_TEST_ENCRYPTION"
# Fixed, for the tests only: a run's rows read back in every process a test starts.
KEY_ID = "test-k1"
KEY = base64.b64encode(bytes(range(32))).decode()
KEYS_JSON = '{"' + KEY_ID + '": "' + KEY + '"}'


def enabled() -> bool:
    return os.environ.get(SWITCH) == "1"


def env() -> dict[str, str]:
    """The settings that turn encryption on, when the suite runs with it."""
    if not enabled():
        return {}
    return {"AGENT_JOBS_ENCRYPTION_KEYS": KEYS_JSON, "AGENT_JOBS_ENCRYPTION_KEY_ID": KEY_ID}


def bare_environ(*, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """This process's environment without any `AGENT_JOBS_` setting (nor the names in
    `drop`), but with the suite's encryption keys when the switch is on: a process a
    test starts from a clean slate still reads and seals the suite's runs."""
    kept = {
        k: v for k, v in os.environ.items() if not k.startswith("AGENT_JOBS_") and k not in drop
    }
    return kept | env()
