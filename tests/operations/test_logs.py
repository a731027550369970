"""Structured logs: the JSON formatter, its context, secrets kept out (workers: see the
end-to-end tests, which read a real worker's JSON lines)."""

from __future__ import annotations

import io
import json
import logging
import sys

import pytest

from agent_jobs.logs import JsonFormatter, configure_logging, log_context
from agent_jobs.settings import get_settings

SECRET = "s3cret-approval-key-123"


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("agent_jobs.test", logging.WARNING, __file__, 1, message, args, None)
    for key, value in extra.items():
        setattr(rec, key, value)
    return rec


def test_a_record_is_one_json_object_with_its_run_and_step() -> None:
    formatter = JsonFormatter()
    with log_context(run_id="r1", step="model:2"):
        line = formatter.format(record("step %s done", "model:2", outcome="ok", entry_id=None))
    doc = json.loads(line)
    assert "\n" not in line
    assert doc["message"] == "step model:2 done" and doc["level"] == "WARNING"
    assert doc["logger"] == "agent_jobs.test" and doc["ts"].endswith("+00:00")
    assert (doc["run_id"], doc["step"], doc["outcome"]) == ("r1", "model:2", "ok")
    assert "entry_id" not in doc  # empty fields are left out
    assert "run_id" not in json.loads(formatter.format(record("outside")))


def test_celery_task_records_name_the_run_and_step() -> None:
    data = {"id": "t-1", "name": "agent_jobs.invoke_tool", "args": "('r9', 'tool:call_2')"}
    doc = json.loads(JsonFormatter().format(record("Task received", data=data)))
    assert doc["task_id"] == "t-1" and doc["task"] == "agent_jobs.invoke_tool"
    assert (doc["run_id"], doc["step"]) == ("r9", "tool:call_2")
    garbled = {"id": "t-2", "name": "x", "args": "[unparseable"}
    assert "run_id" not in json.loads(JsonFormatter().format(record("x", data=garbled)))


def test_secrets_are_masked_and_secret_fields_dropped() -> None:
    formatter = JsonFormatter(redact=[SECRET, "abc"])
    rec = record(
        "connecting with %s", SECRET, sig="f" * 64, api_key="k", password="p", note=f"x{SECRET}"
    )
    try:
        raise RuntimeError(f"failed with {SECRET}")
    except RuntimeError:
        rec.exc_info = sys.exc_info()
    line = formatter.format(rec)
    assert SECRET not in line and "f" * 64 not in line
    doc = json.loads(line)
    assert doc["message"] == "connecting with ***" and doc["note"] == "x***"
    assert not {"sig", "api_key", "password"} & set(doc)
    assert "failed with ***" in doc["exc"]
    assert "abc" not in formatter.redact  # too short to mask safely


def test_the_configured_secrets_are_masked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_JOBS_APPROVAL_SECRET", SECRET)
    monkeypatch.setenv("AGENT_JOBS_DATABASE_URL", "postgresql+psycopg://u:db-pass-9876@h/d")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-0123456789")
    monkeypatch.setenv("AGENT_JOBS_API_TOKENS", '{"api-token-5555": "alice"}')
    get_settings.cache_clear()
    stream = io.StringIO()
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure_logging("json", "INFO")
        handler = root.handlers[-1]
        assert isinstance(handler, logging.StreamHandler)
        handler.setStream(stream)
        logging.getLogger("agent_jobs.x").info(
            "secret %s db %s key %s token %s",
            SECRET,
            "db-pass-9876",
            "sk-test-0123456789",
            "api-token-5555",
        )
    finally:
        root.handlers[:], root.level = saved
        get_settings.cache_clear()
    doc = json.loads(stream.getvalue())
    assert doc["message"] == "secret *** db *** key *** token ***"
