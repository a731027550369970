"""Every table in one place (SQLAlchemy Core). Alembic migrations mirror this module."""

from __future__ import annotations

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    and_,
    cast,
    false,
    literal_column,
)
from sqlalchemy.dialects.postgresql import JSONB

from agent_jobs.store.payloads import Payload, PayloadText

metadata = MetaData()

# JSONB on Postgres (compact, indexable), plain JSON text on SQLite.
Json = JSON().with_variant(JSONB(), "postgresql")
# SQLite only auto-increments an INTEGER PRIMARY KEY.
BigId = BigInteger().with_variant(Integer(), "sqlite")

threads = Table(
    "threads",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("title", PayloadText, nullable=True),
    # The last sequence number handed to the thread's session log (events).
    Column("event_seq", BigInteger, nullable=False, server_default="0"),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

runs = Table(
    "runs",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("thread_id", String(64), ForeignKey("threads.id"), nullable=False),
    Column("agent", String(200), nullable=False),
    Column("actor", String(200), nullable=False),
    Column("persona", String(200), nullable=True),
    Column("input", PayloadText, nullable=False),
    Column("status", String(32), nullable=False),
    Column("output", PayloadText, nullable=True),
    Column("error", Text, nullable=True),
    Column("error_type", String(200), nullable=True),
    Column("metadata", Payload, nullable=False),
    Column("runner", String(16), nullable=False),
    Column("parent_run_id", String(64), ForeignKey("runs.id"), nullable=True),
    # The top-level ancestor: its live stream carries this run's frames.
    Column("root_run_id", String(64), nullable=False),
    Column("depth", Integer, nullable=False, default=0),
    # The UTC day stamped once when the run starts: quota-by-day stays stable on replay.
    Column("day", String(10), nullable=False),
    # Why the run waits (the step it is parked on), shown by `status` and in Flower.
    Column("waiting_on", Text, nullable=True),
    # A cancel asked for (user, timeout, parent, shutdown, superseded): the run stops at
    # its next boundary. The request is also a `turn/stopping` event in the session log.
    Column("cancel_cause", String(16), nullable=True),
    Column("cancel_keep_inbox", Boolean, nullable=False, server_default=false()),
    # Past this moment the run is cancelled with cause `timeout` (agent default_timeout).
    Column("deadline", DateTime(timezone=True), nullable=True),
    # A pause asked for (by this actor): the run stops at its next step boundary, `paused`.
    Column("pause_requested_by", String(200), nullable=True),
    # The agent's `concurrency_key` of this run (its actor, its thread, …): at most the
    # agent's `max_concurrent` runs of one key run at once; the rest stay queued, in order.
    Column("concurrency_key", String(300), nullable=True),
    # The W3C trace context (`traceparent`, `tracestate`) the run was started in: each of
    # its steps is a span parented on it (agent_jobs/observability/tracing.py). Null when
    # tracing is off.
    Column("trace_context", Json, nullable=True),
    # The process that drives an inline run (its host, pid and start): a run left
    # unfinished by a process that is gone is ended by the next one that meets it
    # (agent_jobs/runners/inline/abandoned.py). Null for durable runs: recovery drives those.
    Column("driver", String(300), nullable=True),
    # When a sleeping run wakes (its `wait` call's time, agent_jobs/timers.py): set while it
    # sleeps, cleared when it wakes or ends. Beat's timers tick looks here for sleepers due.
    Column("wake_at", DateTime(timezone=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=True),
)
# The runs list (agent_jobs/store/listing.py): newest first by (created_at, id), one
# index per filter so each filtered page is a short index scan, however many runs.
Index("ix_runs_created", runs.c.created_at, runs.c.id)
Index("ix_runs_status_created", runs.c.status, runs.c.created_at, runs.c.id)
Index("ix_runs_agent_created", runs.c.agent, runs.c.created_at, runs.c.id)
Index("ix_runs_actor_created", runs.c.actor, runs.c.created_at, runs.c.id)
Index("ix_runs_thread_created", runs.c.thread_id, runs.c.created_at, runs.c.id)
Index("ix_runs_root", runs.c.root_run_id)
# The sleepers, by wake time: only runs that sleep are in it, so a tick is an index probe.
Index(
    "ix_runs_wake_at",
    runs.c.wake_at,
    postgresql_where=runs.c.wake_at.is_not(None),
    sqlite_where=runs.c.wake_at.is_not(None),
)
# What a search (`q`) looks in: the run's id, input and metadata, as one text. On Postgres
# a trigram index over it (pg_trgm) answers `ILIKE '%word%'`: SEARCH_INDEX, made by
# migration 0008 where the extension can be had, over this very expression (the planner
# uses it for no other). It is declared nowhere here, since it may not be there; the
# search works without it, reading the table.
SEARCH_TEXT = (
    runs.c.id
    + literal_column("' '", Text)
    + runs.c.input
    + literal_column("' '", Text)
    + cast(runs.c.metadata, Text)
)
SEARCH_INDEX = "ix_runs_search"
# Unfinished runs are indexed by status alone too (what the sweep and `runs --status` look
# for). `updated_at` is in no index: a pass that only touches a run (its lease, its
# waiting step) stays a cheap heap-only update in Postgres. A change of status is not
# heap-only anyway (status is in these indexes), nor ever was.
_UNFINISHED = runs.c.status.not_in(("completed", "failed", "cancelled"))
Index(
    "ix_runs_unfinished",
    runs.c.status,
    postgresql_where=_UNFINISHED,
    sqlite_where=_UNFINISHED,
)
Index("ix_runs_parent", runs.c.parent_run_id)
# The runs of one agent and key that hold (or wait for) a place, in the order they came.
_HELD = and_(runs.c.concurrency_key.is_not(None), _UNFINISHED)
Index(
    "ix_runs_concurrency",
    runs.c.agent,
    runs.c.concurrency_key,
    runs.c.created_at,
    postgresql_where=_HELD,
    sqlite_where=_HELD,
)

messages = Table(
    "messages",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("thread_id", String(64), ForeignKey("threads.id"), nullable=False),
    Column("run_id", String(64), nullable=True),
    Column("role", String(16), nullable=False),
    Column("content", PayloadText, nullable=False),
    Column("tool_calls", Payload, nullable=True),
    Column("tool_call_id", String(200), nullable=True),
    Column("name", String(200), nullable=True),
    Column("is_error", Boolean, nullable=False, default=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)
Index("ix_messages_thread_id", messages.c.thread_id, messages.c.id)

tool_calls = Table(
    "tool_calls",
    metadata,
    Column("run_id", String(64), ForeignKey("runs.id"), primary_key=True),
    Column("call_id", String(200), primary_key=True),
    Column("thread_id", String(64), nullable=False),
    Column("name", String(200), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("args", Payload, nullable=False),
    # auto_executed | pending_approval | approved | rejected | executed | failed
    Column("status", String(32), nullable=False),
    Column("result", Payload, nullable=True),
    Column("error", Text, nullable=True),
    Column("decision", String(16), nullable=True),
    Column("decided_by", String(200), nullable=True),
    Column("decision_reason", PayloadText, nullable=True),
    Column("decided_at", DateTime(timezone=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    # When the person was asked (the `approval_request` frame went out), and when an
    # undecided call times out (`approval_timeout`): the sweep decides it then.
    Column("requested_at", DateTime(timezone=True), nullable=True),
    Column("approval_deadline", DateTime(timezone=True), nullable=True),
    # Escalated once its first deadline passed (`on_timeout="escalate"`): `approvers`
    # are then the roles that may decide (the tool's `escalate_to`); None: the tool's.
    Column("escalated", Boolean, nullable=False, server_default=false()),
    Column("approvers", Json, nullable=True),
    # A non-idempotent action's handler began (committed before it ran): a worker that
    # died then leaves an outcome nobody knows, which is never retried blindly.
    Column("handler_started_at", DateTime(timezone=True), nullable=True),
)
# A reader who may decide some action tools may read the runs that called them
# (agent_jobs/store/listing.py, `Reader`).
_ACTION = tool_calls.c.kind == "action"
Index(
    "ix_tool_calls_action",
    tool_calls.c.name,
    tool_calls.c.run_id,
    postgresql_where=_ACTION,
    sqlite_where=_ACTION,
)
# Only calls waiting for a person are looked up by status.
_PENDING = tool_calls.c.status == "pending_approval"
Index(
    "ix_tool_calls_pending",
    tool_calls.c.status,
    postgresql_where=_PENDING,
    sqlite_where=_PENDING,
)
# The sweep's question: which undecided calls are past their deadline.
_DEADLINED = and_(_PENDING, tool_calls.c.approval_deadline.is_not(None))
Index(
    "ix_tool_calls_deadline",
    tool_calls.c.approval_deadline,
    postgresql_where=_DEADLINED,
    sqlite_where=_DEADLINED,
)

usage = Table(
    "usage",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("run_id", String(64), nullable=False),
    Column("thread_id", String(64), nullable=False),
    Column("actor", String(200), nullable=False),
    Column("day", String(10), nullable=False),
    Column("step", String(200), nullable=False),
    Column("kind", String(16), nullable=False),  # model | summary
    Column("model", String(200), nullable=True),
    Column("input_tokens", Integer, nullable=False),
    Column("output_tokens", Integer, nullable=False),
    Column("cost", Float, nullable=True),
    Column("cost_source", String(16), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    # Of `input_tokens`, those read from and written to the provider's prompt cache.
    Column("cache_read_tokens", Integer, nullable=False, server_default="0"),
    Column("cache_write_tokens", Integer, nullable=False, server_default="0"),
)
Index("ix_usage_run", usage.c.run_id)

quota_usage = Table(
    "quota_usage",
    metadata,
    Column("actor", String(200), primary_key=True),
    Column("day", String(10), primary_key=True),
    Column("tokens", BigInteger, nullable=False),
)

journal = Table(
    "journal",
    metadata,
    Column("run_id", String(64), primary_key=True),
    Column("step", String(300), primary_key=True),
    Column("seq", Integer, nullable=False),
    # scheduled -> started -> done | failed; "waiting" for a human decision.
    Column("state", String(16), nullable=False),
    Column("intent", Payload, nullable=True),
    Column("result", Payload, nullable=True),
    Column("error", Text, nullable=True),
    Column("attempts", Integer, nullable=False, default=0),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=True),
    # A started remote step belongs to its worker until then; the worker extends it
    # while it runs. Past it, the sweep hands the step to another worker.
    Column("lease_until", DateTime(timezone=True), nullable=True),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    # The process that claimed the step in the very pass that scheduled it (to run it
    # at once, with no broker round trip): its lease lives here, with `lease_until`,
    # instead of in Redis. Empty for a step a delivered task runs.
    Column("holder", String(200), nullable=True),
    # A remote step held back until then (a deliberate retry later, a provider's rate
    # limit): recovery and the sweep leave it alone until this moment.
    Column("not_before", DateTime(timezone=True), nullable=True),
    # The step's epoch: moved on each time its holder is let go of (taken for dead, given
    # up at its time limit, its lease run out), so whatever that holder writes later (its
    # outcome, a renewed lease, a retry) is refused: only a delivery that read the epoch
    # as it is now writes (runners/durable/runner.py).
    Column("fence", Integer, nullable=False, server_default="0"),
    # The worker process that ran the step (its session name), for the run's timeline.
    Column("worker", String(200), nullable=True),
)
Index("ix_journal_run_seq", journal.c.run_id, journal.c.seq, unique=True)

# The session log: every runtime transition of a thread, append-only, in order.
events = Table(
    "events",
    metadata,
    Column("thread_id", String(64), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("run_id", String(64), nullable=True),
    Column("type", String(64), nullable=False),
    Column("data", Payload, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

# Questions a tool asked a person, and the answers (the first answer wins).
questions = Table(
    "questions",
    metadata,
    Column("run_id", String(64), ForeignKey("runs.id"), primary_key=True),
    Column("request_id", String(300), primary_key=True),
    Column("call_id", String(200), nullable=False),
    Column("tool", String(200), nullable=False),
    Column("questions", Payload, nullable=False),
    Column("answers", Payload, nullable=True),
    Column("answered_by", String(200), nullable=True),
    Column("answered_at", DateTime(timezone=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

# Notifications (docs/operating.md, "Notifications"): a run that ends or starts waiting for a person
# is written here in the same transaction as its new status, then appended to the Redis
# Stream `agent_jobs:events` and POSTed to the webhook, at least once, by a sender that
# retries with backoff. `event_id` is the notification's id: a duplicate carries it too.
outbox = Table(
    "outbox",
    metadata,
    Column("id", BigId, primary_key=True, autoincrement=True),
    Column("event_id", String(64), nullable=False, unique=True),
    Column("type", String(64), nullable=False),
    Column("run_id", String(64), nullable=False),
    Column("body", Payload, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("streamed_at", DateTime(timezone=True), nullable=True),  # on agent_jobs:events
    Column("delivered_at", DateTime(timezone=True), nullable=True),  # everywhere it goes
    Column("attempts", Integer, nullable=False, server_default="0"),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False),
    Column("last_error", Text, nullable=True),
)
_UNDELIVERED = outbox.c.delivered_at.is_(None)
Index(
    "ix_outbox_undelivered",
    outbox.c.next_attempt_at,
    postgresql_where=_UNDELIVERED,
    sqlite_where=_UNDELIVERED,
)

# Schedules (docs/schedules.md): defined in code (`app.schedule`); their state is kept here.
# A tick locks a schedule's row, starts the runs of the occurrences due since
# `last_occurrence` (or since `active_from` when none started yet) and moves it on, in one
# transaction with the runs' rows: with the run ids' uniqueness, each occurrence starts
# one run however many ticks race.
schedules = Table(
    "schedules",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("paused", Boolean, nullable=False, server_default=false()),
    # Occurrences up to this instant are not due: when the row was first written, or
    # when the schedule was resumed.
    Column("active_from", DateTime(timezone=True), nullable=False),
    Column("last_occurrence", DateTime(timezone=True), nullable=True),  # the newest started
    Column("last_run_id", String(64), nullable=True),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

# Encryption at rest (docs/security.md, "Encryption at rest"; agent_jobs/encryption): one
# data key per actor seals that actor's payloads; it is kept here only wrapped (AES-GCM)
# by a master key of AGENT_JOBS_ENCRYPTION_KEYS, bound to its id and actor. Forgetting an
# actor clears `wrapped` (and stamps `forgotten_at`): what it sealed cannot be opened
# again, backups included. At most one live (unforgotten) key per actor.
data_keys = Table(
    "data_keys",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("actor", String(200), nullable=False),
    Column("wrapped", LargeBinary, nullable=True),
    Column("master_key_id", String(200), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("rotated_at", DateTime(timezone=True), nullable=True),
    Column("forgotten_at", DateTime(timezone=True), nullable=True),
)
DATA_KEY_LIVE = data_keys.c.forgotten_at.is_(None)
Index(
    "ix_data_keys_live",
    data_keys.c.actor,
    unique=True,
    postgresql_where=DATA_KEY_LIVE,
    sqlite_where=DATA_KEY_LIVE,
)
Index("ix_data_keys_master", data_keys.c.master_key_id)

# Payloads kept apart (agent_jobs/store/blobs.py): a payload column's value over
# AGENT_JOBS_PAYLOAD_INLINE_LIMIT bytes is here, addressed by the SHA-256 of its bytes (one
# row however many columns hold it); the column holds a small reference to it.
payload_blobs = Table(
    "payload_blobs",
    metadata,
    Column("sha256", String(64), primary_key=True),  # hex
    Column("size", BigInteger, nullable=False),
    Column("data", LargeBinary, nullable=False),
    # When a row last came to refer to it (each write sets it, the first and the next): a
    # prune keeps a blob written lately, whose row may not have committed yet.
    Column("written_at", DateTime(timezone=True), nullable=False),
)
