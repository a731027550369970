"""Provider rate limits, piece by piece: the setting, which key a model falls under, and
the buckets (in Redis, one script a decision on Redis's clock; in process, the same
rules), against a real Redis."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redis
from pydantic import ValidationError
from redis.backoff import ConstantBackoff
from redis.retry import Retry

from agent_jobs import AgentApp, ScriptedModel
from agent_jobs.messages import Message, ModelRequest, ModelSettings
from agent_jobs.ratelimits import buckets as bucket_module
from agent_jobs.ratelimits.buckets import Buckets, LocalBuckets, RedisBuckets
from agent_jobs.ratelimits.gate import ModelGate, estimate, model_name
from agent_jobs.ratelimits.rules import RateLimit, Rule, Rules
from agent_jobs.settings import Settings
from tests.support.redis_server import RedisServer, free_port
from tests.support.waiting import eventually

# --- the setting ------------------------------------------------------------------------


def test_the_setting_is_a_json_object_of_model_keys_to_limits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    written = (
        '{"openai:gpt-4.1*": {"requests_per_minute": 60}, "openai:*": {"tokens_per_minute": 9e4}}'
    )
    monkeypatch.setenv("AGENT_JOBS_RATE_LIMITS", written)
    limits = Settings().rate_limits
    assert list(limits) == ["openai:gpt-4.1*", "openai:*"]  # in the order written
    assert limits["openai:gpt-4.1*"] == RateLimit(requests_per_minute=60)
    assert limits["openai:*"].tokens_per_minute == 90_000
    monkeypatch.setenv("AGENT_JOBS_RATE_LIMITS", "")
    assert Settings().rate_limits == {}
    monkeypatch.delenv("AGENT_JOBS_RATE_LIMITS")
    assert Settings().rate_limits == {}  # unset: off
    # A TOML table (config/agent_jobs.toml) arrives as a mapping.
    table = {"anthropic:*": {"requests_per_minute": 50}}
    assert Settings(rate_limits=table).rate_limits["anthropic:*"].requests_per_minute == 50


@pytest.mark.parametrize(
    ("written", "says"),
    [
        ('{"openai:*": {"requests_per_minute": 500}', "is not JSON"),
        ('["openai:*"]', "must be an object of model keys to limits"),
        ('{"openai:*": {"request_per_minute": 500}}', "request_per_minute"),  # a typo
        ('{"openai:*": {"requests_per_minute": 0}}', "greater than 0"),
        ('{"openai:*": {"tokens_per_minute": -5}}', "greater than 0"),
        ('{"": {"requests_per_minute": 5}}', "a model key must be a glob"),
        ('{"openai:*": 500}', "valid dictionary"),
    ],
)
def test_a_bad_setting_is_refused_with_what_to_write(
    monkeypatch: pytest.MonkeyPatch, written: str, says: str
) -> None:
    monkeypatch.setenv("AGENT_JOBS_RATE_LIMITS", written)
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert "rate_limits" in str(refused.value) and says in str(refused.value)


def test_the_first_key_that_matches_a_model_wins_and_star_is_the_only_wildcard() -> None:
    rules = Rules(
        {
            "openai:gpt-4.1-mini": RateLimit(requests_per_minute=10),
            "openai:*": RateLimit(requests_per_minute=500),
            "*:llama[3]?": RateLimit(requests_per_minute=7),  # `[` and `?` are literal
            "ollama:*:8b": RateLimit(requests_per_minute=3),
        }
    )
    assert rules.match("openai:gpt-4.1-mini").key == "openai:gpt-4.1-mini"  # type: ignore[union-attr]
    assert rules.match("openai:gpt-4.1").key == "openai:*"  # type: ignore[union-attr]
    assert rules.match("openai:o3/mini:x").key == "openai:*"  # type: ignore[union-attr]
    assert rules.match("vllm:llama[3]?").key == "*:llama[3]?"  # type: ignore[union-attr]
    assert rules.match("vllm:llama3x") is None
    assert rules.match("ollama:llama3.1:8b").key == "ollama:*:8b"  # type: ignore[union-attr]
    assert rules.match("anthropic:claude-haiku-4-5") is None
    assert rules.match("OPENAI:gpt-4.1") is None  # as the provider is named: lower case
    assert not Rules({})


def test_a_models_key_is_the_provider_and_the_model_its_request_names() -> None:
    scripted = ScriptedModel([{"text": "hi"}], name="openai:gpt-4.1-mini")
    request = ModelRequest(run_id="r", agent="a", step=0, system="s", messages=[])
    assert model_name(scripted, request) == "openai:gpt-4.1-mini"
    chosen = request.model_copy(update={"settings": ModelSettings(model="gpt-4.1")})
    assert model_name(scripted, chosen) == "openai:gpt-4.1"  # an agent's options, a selection
    assert model_name(ScriptedModel([{"text": "hi"}]), chosen) == "scripted"  # no provider


def test_a_requests_tokens_are_estimated_from_what_it_sends_and_its_output_cap() -> None:
    model = ScriptedModel([{"text": "hi"}], name="openai:x")
    text = "x" * 4000
    request = ModelRequest(
        run_id="r", agent="a", step=0, system="", messages=[Message(role="user", content=text)]
    )
    assert 1000 <= estimate(model, request) <= 1100
    capped = request.model_copy(update={"settings": ModelSettings(max_tokens=500)})
    assert estimate(model, capped) == estimate(model, request) + 500


# --- the buckets ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """A Redis of these tests' own: their keys and scripts touch no other test's."""
    s = RedisServer().start()
    yield s
    s.close()


@dataclass(frozen=True)
class Took:
    """A bucket's verdict, and when on the bucket's own clock it was asked (`before` the
    call, `after` it): the moment it grants is `wait` after a moment in between."""

    wait: float
    paused: bool
    before: float
    after: float


class Clocked:
    """Buckets whose calls are timed on their own clock (Redis's TIME, or the process's
    monotonic clock), so a test judges the places they give, not how fast it called."""

    def __init__(self, buckets: Buckets, now: Callable[[], float]) -> None:
        self.buckets = buckets
        self.now = now

    def take(self, rule: Rule, tokens: int, owner: str) -> Took:
        before = self.now()
        verdict = self.buckets.take(rule, tokens, owner)
        return Took(verdict.wait, verdict.paused, before, self.now())

    def pause(self, rule: Rule, seconds: float) -> Took:
        before = self.now()
        self.buckets.pause(rule, seconds)
        return Took(0.0, False, before, self.now())

    def correct(self, rule: Rule, tokens: int) -> Took:
        before = self.now()
        self.buckets.correct(rule, tokens)
        return Took(0.0, False, before, self.now())

    def until(self, moment: float) -> None:
        """Wait until the bucket's clock has reached `moment`."""
        eventually(lambda: self.now() >= moment, what=f"the buckets' clock at {moment}")


MS = 0.002  # the buckets count in whole milliseconds, rounded up


def placed(took: Took, ref: Took, offset: float) -> bool:
    """Whether `took` was given the place `offset` seconds after the moment of `ref`
    (both moments known to within their calls): a step waits for its place, or goes at
    once when its place has come."""
    if took.wait == 0:
        return ref.before + offset <= took.after + MS
    low = took.wait + took.before - ref.after - MS
    high = took.wait + took.after - ref.before + MS
    return low <= offset <= high


def redis_now(client: redis.Redis) -> Callable[[], float]:
    def now() -> float:
        seconds, micros = client.time()  # type: ignore[misc]
        return float(seconds) + float(micros) / 1e6

    return now


@pytest.fixture(params=["redis", "local"])
def kept(request: pytest.FixtureRequest, server: RedisServer) -> Iterator[Clocked]:
    """The buckets in Redis and in this process: the same rules."""
    if request.param == "local":
        yield Clocked(LocalBuckets(clock=time.monotonic), time.monotonic)
        return
    client = redis.Redis.from_url(server.url(0))
    yield Clocked(RedisBuckets(client), redis_now(client))
    client.close()


def _rule(**limits: float) -> Rule:
    return Rule(f"test:{uuid.uuid4().hex[:8]}", RateLimit(**limits))  # a key of its own


def _owner() -> str:
    return f"run-{uuid.uuid4().hex[:8]}:model:1"


def test_a_key_lets_a_seconds_worth_go_at_once_then_one_at_a_time(kept: Clocked) -> None:
    rule = _rule(requests_per_minute=120)  # two a second: a bucket of two
    first = kept.take(rule, 0, _owner())
    assert first.wait == 0
    assert kept.take(rule, 0, _owner()).wait == 0
    waiting = [kept.take(rule, 0, _owner()) for _ in range(3)]
    # Each waiting step gets its own place, half a second after the one before.
    for took, offset in zip(waiting, (0.5, 1.0, 1.5), strict=True):
        assert placed(took, first, offset), (took, first, offset)


def test_a_step_back_on_its_place_goes_and_back_early_waits_for_it(kept: Clocked) -> None:
    rule = _rule(requests_per_minute=300)  # five a second: places 0.2 s apart
    first = kept.take(rule, 0, _owner())
    assert first.wait == 0
    for _ in range(4):
        assert kept.take(rule, 0, _owner()).wait == 0
    late = _owner()
    took = kept.take(rule, 0, late)
    assert took.wait > 0 and placed(took, first, 0.2), took
    # Back too early (a stray delivery): the rest of the wait, the same place kept.
    again = kept.take(rule, 0, late)
    assert again.wait > 0 and placed(again, first, 0.2), again
    assert placed(kept.take(rule, 0, _owner()), first, 0.4)  # behind it
    kept.until(took.after + took.wait)  # its place has come
    assert kept.take(rule, 0, late).wait == 0  # its place, with no queueing again
    # The place is used: asking again is a new request, behind the others.
    assert placed(kept.take(rule, 0, late), first, 0.6)


def test_a_pause_stops_every_step_and_voids_the_places_inside_it(kept: Clocked) -> None:
    rule = _rule(requests_per_minute=600)  # ten a second
    first = kept.take(rule, 0, _owner())
    assert first.wait == 0
    for _ in range(9):
        assert kept.take(rule, 0, _owner()).wait == 0
    early = _owner()
    queued = kept.take(rule, 0, early)
    assert queued.wait > 0 and placed(queued, first, 0.1), queued
    paused = kept.pause(rule, 1.0)  # a 429: Retry-After 1
    fresh = kept.take(rule, 0, _owner())
    assert fresh.paused and placed(fresh, paused, 1.0), (fresh, paused)
    kept.until(queued.after + queued.wait)  # its place has come, inside the pause
    # Its place fell inside the pause: void; it queues again, behind the pause (at its
    # end, or one place after it).
    again = kept.take(rule, 0, early)
    assert again.paused, again
    assert again.wait + again.after >= paused.before + 1.0 - MS, (again, paused)
    assert again.wait + again.before <= paused.after + 1.1 + MS, (again, paused)
    # The key resumes one request at a time: the places after the pause are a tenth of
    # a second apart, not a bucket's worth at once.
    assert placed(kept.take(rule, 0, _owner()), again, 0.1 + again.wait)
    # A shorter pause does not shorten a longer one.
    kept.pause(rule, 0.1)
    after = kept.take(rule, 0, _owner())
    assert after.wait + after.after >= paused.before + 1.0 - MS, (after, paused)


def test_tokens_are_taken_up_front_and_a_large_request_goes_on_a_full_bucket(
    kept: Clocked,
) -> None:
    rule = _rule(tokens_per_minute=6000)  # a hundred a second
    first = kept.take(rule, 60, _owner())
    assert first.wait == 0
    assert kept.take(rule, 40, _owner()).wait == 0
    assert placed(kept.take(rule, 50, _owner()), first, 0.5)
    big = _rule(tokens_per_minute=6000)
    full = kept.take(big, 300, _owner())
    assert full.wait == 0  # more than a bucket: it goes when full
    owed = kept.take(big, 10, _owner())
    assert owed.wait > 0 and placed(owed, full, 2.1), owed  # and owes


def test_what_a_call_used_corrects_what_it_took(kept: Clocked) -> None:
    more = _rule(tokens_per_minute=6000)
    first = kept.take(more, 50, _owner())
    assert first.wait == 0
    kept.correct(more, 150)  # it used 200
    assert placed(kept.take(more, 10, _owner()), first, 1.1)
    fewer = _rule(tokens_per_minute=6000)
    first = kept.take(fewer, 100, _owner())
    assert first.wait == 0
    assert placed(kept.take(fewer, 100, _owner()), first, 1.0)
    kept.correct(fewer, -100)  # the first used none: its tokens are back
    assert placed(kept.take(fewer, 100, _owner()), first, 1.0)
    kept.correct(fewer, -10_000)  # a refund never fills the bucket past full
    refilled = kept.take(fewer, 100, _owner())
    assert refilled.wait == 0
    assert placed(kept.take(fewer, 100, _owner()), refilled, 1.0)


def test_requests_and_tokens_both_hold_a_step_back(kept: Clocked) -> None:
    rule = _rule(requests_per_minute=60, tokens_per_minute=60_000)
    first = kept.take(rule, 10, _owner())
    assert first.wait == 0
    assert placed(kept.take(rule, 10, _owner()), first, 1.0)  # requests
    rule = _rule(requests_per_minute=6000, tokens_per_minute=600)
    first = kept.take(rule, 10, _owner())
    assert first.wait == 0
    assert placed(kept.take(rule, 10, _owner()), first, 1.0)  # tokens


def test_a_key_only_named_is_limited_by_nothing_but_a_pause(kept: Clocked) -> None:
    rule = _rule()
    assert all(kept.take(rule, 10**6, _owner()).wait == 0 for _ in range(50))
    paused = kept.pause(rule, 0.5)
    took = kept.take(rule, 0, _owner())
    assert took.wait > 0 and placed(took, paused, 0.5), (took, paused)


def test_the_state_in_redis_lapses_once_it_says_nothing(server: RedisServer) -> None:
    client = redis.Redis.from_url(server.url(0))
    try:
        rule, owner = _rule(requests_per_minute=60), _owner()
        shared = RedisBuckets(client)
        assert shared.take(rule, 0, _owner()).wait == 0
        assert shared.take(rule, 0, owner).wait > 0
        state = bucket_module.STATE_PREFIX + rule.key
        grant = bucket_module.GRANT_PREFIX + owner
        # Both keys expire: the state a minute after it stops mattering, a grant ten
        # minutes after its moment.
        assert 0 < client.pttl(state) <= 62_000  # type: ignore[operator]
        assert 600_000 < client.pttl(grant) <= 602_000  # type: ignore[operator]
    finally:
        client.close()


def test_with_redis_unreachable_a_step_goes_on_unlimited_at_once(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Connections refused, tried three times with waits between: a second or so.
    gone = redis.Redis(port=free_port(), retry=Retry(ConstantBackoff(0.3), 2))
    kind = gone.connection_pool.connection_class
    tries: list[object] = []  # each connection attempt (with its retries)
    connect = kind.connect

    def counted(self: object) -> None:
        tries.append(self)
        connect(self)  # type: ignore[arg-type]

    monkeypatch.setattr(kind, "connect", counted)
    rule = _rule(requests_per_minute=1)
    shared = RedisBuckets(gone)
    started = time.monotonic()
    assert shared.take(rule, 0, _owner()).wait == 0
    assert time.monotonic() - started >= 0.5  # it did try, and wait between its tries
    assert tries
    tried = len(tries)
    # Then it goes on without trying, for a while: an outage costs a step nothing more.
    assert [shared.take(rule, 0, _owner()).wait for _ in range(3)] == [0, 0, 0]
    shared.pause(rule, 5)  # neither raises
    shared.correct(rule, 5)
    assert len(tries) == tried  # no connection tried since
    assert caplog.text.count("Redis cannot be reached") == 1
    gone.close()


def test_with_no_key_set_there_is_no_gate_and_no_redis_command(server: RedisServer) -> None:
    app = AgentApp()
    app.agent("a", model=ScriptedModel([{"text": "hi"}], name="openai:x"))
    client = redis.Redis.from_url(server.url(0))
    try:
        assert ModelGate.of(app, Settings(), client) is None
        assert ModelGate.inline(app, Settings(redis_url=server.url(0))) is None
        # A key that matches no model: the step goes, and Redis hears nothing of it.
        gate = ModelGate.of(app, Settings(rate_limits={"anthropic:*": {}}), client)
        assert gate is not None
        client.config_resetstat()
        request = ModelRequest(run_id="r", agent="a", step=0, system="", messages=[])
        gate.admit({"type": "model_turn", "request": request.model_dump()}, "r", "model:1")
        gate.wait(request, "r:model:1", lambda seconds: pytest.fail("no wait"))
        stats = client.info("commandstats")
        assert [name for name in stats if not name.startswith("cmdstat_config")] == [], stats
    finally:
        client.close()
