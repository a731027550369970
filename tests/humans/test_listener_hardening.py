"""The approvals listener against what costs it time or memory: odd signatures, huge
stream entries, and a subscriber Redis disconnects.

Everything runs for real: the listener and a worker are subprocesses on a
`redis-server` of this module's own, whose pub/sub output-buffer limit is lowered to a
few MB so that a message over it is cheap to send.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from agent_jobs.approvals.listener import ListenerSettings
from agent_jobs.approvals.messages import Refused, parse_message
from tests.support.doors import SECRET, Doors, approval, open_doors, signed, wait_for
from tests.support.redis_server import RedisServer

FAST = {"AGENT_JOBS_LISTENER_CLAIM_IDLE": "0.5"}
PUBSUB_LIMIT_MB = 4
MiB = 1 << 20

# Every one of these made `hmac.compare_digest` raise TypeError.
NON_ASCII_SIGS = [
    "\u00e9" * 64,
    "\u0663" * 64,  # ARABIC-INDIC DIGIT THREE: a digit to str.isdigit, not hex
    "\uff41" * 64,  # FULLWIDTH LATIN SMALL LETTER A
    "0" * 63 + "\u00ff",
    "\U0001f600",
]

# The dead-letter stream's entries with `message` replaced by its length: the test
# must not download the 50 MB it checks the listener never downloaded either.
DEAD_LETTERS_WITHOUT_MESSAGES = """
local out = {}
for _, entry in ipairs(redis.call('XRANGE', KEYS[1], '-', '+')) do
  local kept = {}
  for i = 1, #entry[2], 2 do
    local name, value = entry[2][i], entry[2][i + 1]
    if name == 'message' then
      name, value = 'message_bytes', tostring(#value)
    end
    kept[#kept + 1] = name
    kept[#kept + 1] = value
  end
  out[#out + 1] = kept
end
return out
"""


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    limit = f"pubsub {PUBSUB_LIMIT_MB}mb {PUBSUB_LIMIT_MB // 2}mb 0"
    s = RedisServer(None, "--client-output-buffer-limit", limit).start()
    yield s
    s.close()


@pytest.fixture(scope="module")
def doors(
    pg_url: str, server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Doors]:
    tmp = tmp_path_factory.mktemp("hardening")
    with open_doors(pg_url, server.url(0), 0, tmp, **FAST) as d:
        d.worker()
        d.start_listener(AGENT_JOBS_LISTENER_HEALTH_FILE=str(d.tmp / "listener.alive"))
        yield d


def numsub(client: redis.Redis, channel: str) -> int:
    reply: Any = client.pubsub_numsub(channel)
    return int(reply[0][1])


def dead_letters(doors: Doors) -> list[dict[str, str]]:
    reply: Any = doors.redis.eval(DEAD_LETTERS_WITHOUT_MESSAGES, 1, f"{doors.channel}:dead")
    return [
        {k.decode(): v.decode() for k, v in zip(flat[::2], flat[1::2], strict=True)}
        for flat in reply
    ]


def pending(doors: Doors) -> int:
    info: Any = doors.redis.xpending(doors.channel, "agent_jobs")
    return int(info["pending"])


def peak_rss_mib(pid: int) -> float:
    """The process's high-water resident set (VmHWM), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


def listener_log(doors: Doors) -> str:
    assert doors.listener is not None
    return doors.listener.log()


def listener_pid(doors: Doors) -> int:
    assert doors.listener is not None and doors.listener.proc is not None
    return doors.listener.proc.pid


# --- 1. a signature that is not ASCII ------------------------------------------------


def test_a_non_ascii_signature_on_the_stream_is_refused_at_once(doors: Doors) -> None:
    """Each of these used to raise in the comparison: counted `error`, left pending, and
    the listener stalled on it for every delivery: the good decision came 19 s late.
    Refused at once means each bad entry is settled on its first delivery: none errs,
    none is delivered again, and the good one behind them is recorded."""
    doors.reset()
    run_id, call_id = doors.parked()
    before = doors.counters()
    reclaims = listener_log(doors).count(": reclaimed (delivery")
    for i in range(20):
        doors.xadd({**approval(run_id, call_id), "sig": NON_ASCII_SIGS[i % len(NON_ASCII_SIGS)]})

    doors.xadd(signed(approval(run_id, call_id)))
    wait_for(
        lambda: doors.count("recorded") == before.get("recorded", 0) + 1,
        f"the good decision\n{doors.logs()}",
    )

    after = doors.counters()
    assert after.get("bad_signature", 0) - before.get("bad_signature", 0) == 20
    assert after.get("error", 0) == before.get("error", 0)
    # Not one stall: no entry was left pending to be reclaimed and delivered again.
    assert listener_log(doors).count(": reclaimed (delivery") == reclaims
    doors.wait_status(run_id, "completed")
    # Acknowledged on their first delivery: nothing pending, nothing reclaimed or moved.
    wait_for(lambda: doors.redis.xlen(doors.channel) == 0, "the entries to be acknowledged")
    assert pending(doors) == 0
    assert doors.redis.xlen(f"{doors.channel}:dead") == 0


def test_a_non_ascii_signature_on_the_channel_is_a_bad_signature(doors: Doors) -> None:
    doors.reset()
    run_id, call_id = doors.parked()
    before = doors.counters()
    for sig in NON_ASCII_SIGS:
        assert doors.publish({**approval(run_id, call_id), "sig": sig}) == 1
    wanted = before.get("bad_signature", 0) + len(NON_ASCII_SIGS)
    wait_for(lambda: doors.count("bad_signature") == wanted, f"the refusals\n{doors.logs()}")
    assert doors.count("error") == before.get("error", 0)


def test_a_message_no_signer_could_encode_is_a_bad_signature(doors: Doors) -> None:
    """A lone surrogate (JSON `"\\ud800"`) has no UTF-8 form, so the canonical JSON the
    signature is taken of cannot be built: refused, not an error tried six times."""
    doors.reset()
    run_id, call_id = doors.parked()
    before = doors.counters()
    message = {**signed(approval(run_id, call_id)), "actor": "\ud800"}
    doors.xadd(message)
    assert doors.publish(message) == 1
    wanted = before.get("bad_signature", 0) + 2
    wait_for(lambda: doors.count("bad_signature") == wanted, f"the refusals\n{doors.logs()}")
    assert doors.count("error") == before.get("error", 0)
    wait_for(lambda: doors.redis.xlen(doors.channel) == 0, "the entry to be acknowledged")
    assert pending(doors) == 0


def test_json_nested_too_deep_to_serialise_again_is_a_bad_signature() -> None:
    """At the seam, in-process: somewhere below the parser's own limit, nesting parses
    but cannot be serialised again for the signature, which used to raise
    RecursionError out of the handler (an `error`, retried, never refused)."""
    reasons: set[str] = set()
    for depth in range(500, 1200):
        raw = json.dumps({**signed(approval("run-1", "call_1")), "reason": ""})
        raw = raw.replace('"reason": ""', '"reason": ' + "[" * depth + "]" * depth)
        with pytest.raises(Refused) as refused:
            parse_message(raw, secret=SECRET)
        reasons.add(refused.value.reason)
    assert reasons == {"bad_signature", "invalid_json"}


# --- 2. stream entries over the size limit -------------------------------------------


def huge_decision(run_id: str, call_id: str, size: int) -> bytes:
    head = json.dumps({**approval(run_id, call_id), "reason": ""})[:-2].encode()
    return head + b"x" * (size - len(head) - 2) + b'"}'


def test_huge_entries_are_moved_aside_without_the_listener_reading_them(
    doors: Doors, tmp_path: Path
) -> None:
    """Four 50 MB entries queued before the listener starts: it used to read them all in
    one batch (409 MB resident); now Redis moves them aside and the listener never holds
    more than a batch of small ones."""
    doors.reset()
    run_id, call_id = doors.parked()
    ghost = Doors(doors.broker, doors.pg_url, tmp_path, **FAST)  # nobody reads it yet
    try:
        payload = huge_decision(run_id, call_id, 50 * MiB)
        huge = [ghost.xadd(payload) for _ in range(4)]
        del payload
        ghost.xadd(signed(approval(run_id, call_id)))

        ghost.start_listener()
        wait_for(lambda: ghost.count("recorded") == 1, f"the good decision\n{ghost.logs()}")
        doors.wait_status(run_id, "completed")
        assert ghost.count("too_large") == 4
        assert ghost.count("error") == 0

        peak = peak_rss_mib(listener_pid(ghost))
        assert peak < 150, f"the listener peaked at {peak:.0f} MiB"

        letters = dead_letters(ghost)
        assert [d["entry_id"] for d in letters] == huge
        for letter in letters:
            assert letter["reason"] == "too_large"
            assert int(letter["size"]) > 50 * MiB
            assert int(letter["message_bytes"]) == 50 * MiB
            assert letter["deliveries"] == "1"
        assert ghost.redis.xlen(ghost.channel) == 0
        assert pending(ghost) == 0
        log = ghost.listener.log() if ghost.listener else ""
        assert "too_large" in log
    finally:
        ghost.close()


def test_an_oversized_entry_is_moved_aside_whatever_its_field(doors: Doors) -> None:
    """The limit is on the entry, every field counted: a huge field beside (or instead
    of) `message` is not downloaded either."""
    doors.reset()
    run_id, call_id = doors.parked()
    before = doors.count("too_large")
    big = doors.xadd(b"y" * MiB, field="decision")
    wait_for(lambda: doors.count("too_large") == before + 1, f"the refusal\n{doors.logs()}")
    [letter] = dead_letters(doors)
    assert letter["entry_id"] == big
    assert letter["reason"] == "too_large"
    assert int(letter["size"]) == len("decision") + MiB
    assert letter["message_bytes"] == "0"  # it had no `message` field
    assert pending(doors) == 0
    doors.xadd(signed(approval(run_id, call_id)))
    doors.wait_status(run_id, "completed")
    doors.redis.delete(f"{doors.channel}:dead")


def test_an_oversized_entry_a_dead_listener_left_pending_is_moved_aside(
    doors: Doors, tmp_path: Path
) -> None:
    """Reclaimed entries are size-checked the same way before they are fetched."""
    doors.reset()
    run_id, call_id = doors.parked()
    ghost = Doors(doors.broker, doors.pg_url, tmp_path, **FAST)
    try:
        ghost.redis.xgroup_create(ghost.channel, "agent_jobs", id="0", mkstream=True)
        big = ghost.xadd(huge_decision(run_id, call_id, 2 * MiB))
        good = ghost.xadd(signed(approval(run_id, call_id)))
        ghost.redis.xreadgroup("agent_jobs", "dead-one", {ghost.channel: ">"})  # never settled

        ghost.start_listener()
        wait_for(lambda: ghost.count("recorded") == 1, f"the reclaim\n{ghost.logs()}")
        doors.wait_status(run_id, "completed")
        assert ghost.count("too_large") == 1
        [letter] = dead_letters(ghost)
        assert (letter["entry_id"], letter["reason"]) == (big, "too_large")
        assert letter["deliveries"] == "2"
        assert int(letter["message_bytes"]) == 2 * MiB
        assert good not in [d["entry_id"] for d in dead_letters(ghost)]
        assert ghost.redis.xlen(ghost.channel) == 0
        assert pending(ghost) == 0
    finally:
        ghost.close()


def seconds_to_record(doors: Doors, run_id: str, call_id: str, source: str) -> float:
    """From the post (on the stream or the channel) to the decision counted recorded."""
    wanted = doors.count("recorded") + 1
    posted = time.monotonic()
    if source == "stream":
        doors.xadd(signed(approval(run_id, call_id)))
    else:
        assert doors.publish(signed(approval(run_id, call_id))) == 1
    wait_for(lambda: doors.count("recorded") == wanted, "the decision", every=0.005)
    return time.monotonic() - posted


def test_a_decision_on_the_stream_is_taken_up_quickly(doors: Doors) -> None:
    """The stream is polled (a script cannot block): the idle poll is short. Judged
    against the channel, measured beside it: the same decision pushed on pub/sub costs
    the same handling and Postgres write with no poll, so whatever the machine's load,
    the stream may cost only a few polls more."""
    doors.reset()
    took: dict[str, list[float]] = {"stream": [], "pubsub": []}
    for _ in range(3):
        for source in took:
            run_id, call_id = doors.parked()
            took[source].append(seconds_to_record(doors, run_id, call_id, source))
            doors.wait_status(run_id, "completed")
    stream, pubsub = (statistics.median(took[s]) for s in ("stream", "pubsub"))
    polls = (stream - pubsub) / ListenerSettings().listener_poll_interval
    assert polls < 10, f"the stream took {polls:.1f} polls more than the channel: {took}"


# --- 3. the subscriber disconnected ---------------------------------------------------


def test_a_message_over_the_output_buffer_limit_costs_one_quick_resubscribe(
    doors: Doors,
) -> None:
    """Redis drops a subscriber whose output buffer overflows: the listener resubscribes
    at once, counts it, and a decision published after that is recorded."""
    doors.reset()
    run_id, call_id = doors.parked()
    wait_for(lambda: numsub(doors.redis, doors.channel) == 1, "the subscription")
    disconnects = doors.count("pubsub_disconnects")
    recorded = doors.count("recorded")

    logged = len(listener_log(doors))
    assert doors.publish(b"z" * (2 * PUBSUB_LIMIT_MB * MiB)) == 1
    wait_for(
        lambda: (
            doors.count("pubsub_disconnects") == disconnects + 1
            and numsub(doors.redis, doors.channel) == 1
        ),
        f"the resubscription\n{doors.logs()}",
    )
    # At once: the loss, then the resubscription, with no failed attempt or backoff
    # between them.
    since = listener_log(doors)[logged:]
    lost = since.index("pub/sub connection lost")
    back = since.index(f"resubscribed to {doors.channel}", lost)
    assert "retrying in" not in since[lost:back], since

    assert doors.publish(signed(approval(run_id, call_id))) == 1
    wait_for(lambda: doors.count("recorded") == recorded + 1, f"the decision\n{doors.logs()}")
    doors.wait_status(run_id, "completed")
    assert doors.listener is not None and doors.listener.running


def test_the_health_file_goes_stale_while_the_subscription_is_down(
    pg_url: str, tmp_path: Path
) -> None:
    """Redis restarted: no beats while the listener cannot subscribe, the loss counted
    once it is back, and beats again."""
    server = RedisServer().start()
    doors = Doors(server.url(0), pg_url, tmp_path, **FAST)
    health = tmp_path / "listener.alive"

    def beating() -> bool:
        return health.exists() and time.time() - health.stat().st_mtime < 1.5

    try:
        doors.start_listener(AGENT_JOBS_LISTENER_HEALTH_FILE=str(health))
        wait_for(beating, "a beat")
        server.stop()
        wait_for(lambda: time.time() - health.stat().st_mtime > 2.5, "the beats to stop")
        assert doors.listener is not None and doors.listener.running
        server.start()
        wait_for(lambda: numsub(doors.redis, doors.channel) == 1, "the resubscription")
        wait_for(lambda: doors.count("pubsub_disconnects") == 1, f"the count\n{doors.logs()}")
        wait_for(beating, f"the beats to resume\n{doors.logs()}")
    finally:
        doors.close()
        server.close()


def test_a_nul_anywhere_in_answers_is_refused_before_the_database() -> None:
    """Postgres jsonb cannot hold `\\u0000`: a NUL nested in answers used to pass the
    check and fail at the INSERT (an `error`, tried again and again)."""
    for answers in ({"q1": "a\x00b"}, {"q1": {"deep": ["x\x00"]}}, {"q\x00": "key"}):
        message = {
            "type": "answers",
            "run_id": "run-1",
            "request_id": "req-1",
            "answers": answers,
            "actor": "bob",
        }
        with pytest.raises(Refused) as refused:
            parse_message(json.dumps(signed(message)), secret=SECRET)
        assert refused.value.reason == "invalid_message"
