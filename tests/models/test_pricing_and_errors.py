"""The price table and the shared error helpers of the adapters."""

from __future__ import annotations

import json
from email.utils import formatdate
from pathlib import Path

import httpx2
import pytest

from agent_jobs.errors import ConfigurationError
from agent_jobs.models._http import (
    classify_status,
    header_cost,
    parse_retry_after,
    redact,
    transport_error_kind,
)
from agent_jobs.models.pricing import ModelPrice, PriceTable, load_price_table, priced_usage

# --- prices ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "model",
    [
        "gpt-4.1-mini",
        "openai/gpt-4.1-mini",
        "gpt-4.1-mini-2025-04-14",
        "openai/gpt-4.1-mini-2025-04-14",
    ],
)
def test_a_model_is_found_under_its_aliases(model: str) -> None:
    assert PriceTable().price_for(model) == ModelPrice(input=0.40, output=1.60, cache_read=0.10)


def test_dated_claude_ids_cost_what_their_alias_costs() -> None:
    assert PriceTable().cost("claude-sonnet-4-5-20250929", 1_000_000, 1_000_000) == 18.0


def test_an_unknown_model_has_no_price() -> None:
    assert PriceTable().price_for("gpt-4.1-mega") is None
    assert PriceTable().cost("gpt-4.1-mega", 10, 10) is None


def test_a_toml_file_overrides_and_extends(tmp_path: Path) -> None:
    path = tmp_path / "prices.toml"
    path.write_text(
        '["gpt-4.1-mini"]\ninput = 1.0\noutput = 1.0\n\n["mine"]\ninput = 3\noutput = 4\n'
    )
    table = load_price_table(path)
    assert table.price_for("gpt-4.1-mini") == ModelPrice(input=1.0, output=1.0)
    assert table.price_for("mine") == ModelPrice(input=3.0, output=4.0)
    assert table.price_for("gpt-4o") is not None  # the built-in entries stay


def test_a_json_file_and_a_dict(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text(json.dumps({"mine": {"input": 3, "output": 4}}))
    assert load_price_table(str(path)).cost("mine", 1_000_000, 0) == 3.0
    assert load_price_table({"mine": {"input": 5, "output": 6}}).cost("mine", 0, 1_000_000) == 6.0


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("bad.toml", "not = [valid"),
        ("bad.json", "{"),
        ("list.json", "[1, 2]"),
        ("partial.toml", '["mine"]\ninput = 1\n'),
    ],
)
def test_a_bad_file_is_a_configuration_error(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(ConfigurationError, match="price table"):
        load_price_table(path)


def test_a_missing_file_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot be read"):
        load_price_table(tmp_path / "nope.toml")


def test_the_provider_cost_beats_the_table() -> None:
    usage = priced_usage(10, 10, model="gpt-4.1", provider_cost=0.5, prices=PriceTable())
    assert (usage.cost, usage.cost_source) == (0.5, "provider")
    usage = priced_usage(10, 10, model="gpt-4.1", provider_cost=None, prices=PriceTable())
    assert usage.cost_source == "price_table" and usage.cost == pytest.approx(0.0001)
    usage = priced_usage(10, 10, model="gpt-4.1", provider_cost=None, prices=None)
    assert (usage.cost, usage.cost_source) == (None, None)


# --- errors ------------------------------------------------------------------------


def test_retry_after_forms() -> None:
    assert parse_retry_after({"Retry-After": "7"}) == 7.0
    assert parse_retry_after({"retry-after": "1.5"}) == 1.5
    assert parse_retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25
    date = formatdate(1_000_030, usegmt=True)
    assert parse_retry_after({"Retry-After": date}, now=1_000_000) == pytest.approx(30)
    assert parse_retry_after({"Retry-After": formatdate(0, usegmt=True)}) == 0.0  # in the past
    assert parse_retry_after({"Retry-After": "soon"}) is None
    assert parse_retry_after({}) is None
    assert parse_retry_after(None) is None


@pytest.mark.parametrize(
    ("status", "code", "error_type", "message", "kind"),
    [
        (429, None, None, "slow down", "rate_limit"),
        (429, "insufficient_quota", None, "You exceeded your current quota", "auth"),
        (503, None, None, "", "overload"),
        (529, None, "overloaded_error", "", "overload"),
        (500, None, None, "", "overload"),
        (504, None, None, "", "timeout"),
        (408, None, None, "", "timeout"),
        (401, None, None, "", "auth"),
        (402, None, None, "insufficient credits", "auth"),
        (403, None, None, "", "auth"),
        (400, "context_length_exceeded", None, "", "context_length"),
        (400, None, None, "This model's maximum context length is 8192 tokens", "context_length"),
        (400, None, "invalid_request_error", "prompt is too long: 9 > 8", "context_length"),
        (413, None, "request_too_large", "", "context_length"),
        (400, None, None, "Unknown parameter", "invalid_request"),
        (404, None, None, "model not found", "invalid_request"),
        (None, None, "overloaded_error", "Overloaded", "overload"),
        (None, None, "rate_limit_error", "", "rate_limit"),
        (None, None, "api_error", "", "overload"),
        (None, None, None, "something odd", "invalid_response"),
    ],
)
def test_classify_status(
    status: int | None, code: str | None, error_type: str | None, message: str, kind: str
) -> None:
    assert classify_status(status, code=code, error_type=error_type, message=message) == kind


def test_transport_errors_of_either_httpx() -> None:
    assert transport_error_kind(httpx2.ReadTimeout("slow")) == "timeout"
    assert transport_error_kind(httpx2.ConnectTimeout("slow")) == "timeout"
    assert transport_error_kind(httpx2.RemoteProtocolError("cut")) == "connection"
    assert transport_error_kind(httpx2.ConnectError("refused")) == "connection"
    # The SDKs before httpx2 used `httpx`, whose classes have the same names.
    legacy = {"__module__": "httpx._exceptions"}
    timeout = type("TimeoutException", (Exception,), legacy)
    transport = type("TransportError", (Exception,), legacy)
    assert transport_error_kind(type("ReadTimeout", (timeout,), legacy)()) == "timeout"
    assert transport_error_kind(type("ReadError", (transport,), legacy)()) == "connection"
    assert transport_error_kind(RuntimeError("a sink failed")) is None
    assert transport_error_kind(ConnectionResetError()) is None  # not from the transport


def test_redact() -> None:
    assert redact("key sk-abc123 refused", ["sk-abc123", None, ""]) == "key [redacted] refused"
    assert redact("no secret here", ["abc"]) == "no secret here"


def test_header_cost() -> None:
    assert header_cost({"X-LiteLLM-Response-Cost": "0.25"}) == 0.25
    assert header_cost({"x-litellm-response-cost": "nan"}) is None
    assert header_cost({"x-litellm-response-cost": "-1"}) is None
    assert header_cost({}) is None
