"""Settings: environment variables prefixed `AGENT_JOBS_`, a `.env` file and `config/`."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from .ratelimits.rules import RateLimit
from .ratelimits.rules import parse as parse_rate_limits

CONFIG_FILE = Path("config") / "agent_jobs.toml"


class SettingsBase(BaseSettings):
    """How every settings class of the project reads: `AGENT_JOBS_` environment
    variables first, then `.env`, then `config/agent_jobs.toml`."""

    model_config = SettingsConfigDict(
        env_prefix="AGENT_JOBS_",
        env_file=".env",
        env_file_encoding="utf-8",
        extra="ignore",
        toml_file=CONFIG_FILE,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            env_settings,
            dotenv_settings,
            TomlConfigSettingsSource(settings_cls),
            file_secret_settings,
        )


class Settings(SettingsBase):
    """Every knob of the system. Environment beats `.env`, which beats `config/`."""

    database_url: str = "sqlite:///agent_jobs.db"
    # The database's password, apart from the URL (which then names none): any character
    # may be in it (`@`, `:`, `/` break a URL), and it is never part of a URL's text.
    # Applied to every engine this process opens (store/db.py: `make_engine`).
    database_password: SecretStr | None = None
    # On Postgres, the schema the tables (and their own Alembic version table) live in:
    # apart from an application's own tables and migrations in the same database.
    database_schema: str = Field(default="agent_jobs", pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    # On Postgres, a peer silent this long is gone, on both sides of every connection:
    # TCP keepalives (probes each second after a third of it) and a limit on data sent
    # and not acknowledged, asked of libpq and of the server's session. So a host cut off
    # from the network holds no row lock (its open transaction) for longer than this.
    database_keepalive: float = Field(default=4.0, ge=1)
    # On Postgres, a session idle inside a transaction this long is ended by the server
    # (its transaction rolled back): a client alive but stuck keeps no lock longer. None:
    # the server's own setting.
    database_idle_in_transaction_timeout: float | None = Field(default=60.0, gt=0)
    broker_url: str | None = None
    # The Celery queue of this deployment: several deployments can share one Redis.
    queue: str = "agent_jobs"
    # Workers also read the queue a Celery client with default settings sends to, so
    # `send_task("agent_jobs.start_run", kwargs=...)` from any service just works.
    # Empty: read only `queue`.
    external_queue: str = "celery"
    redis_url: str | None = None
    app: str | None = None
    approvals_channel: str = "agent_jobs:approvals"
    approval_secret: SecretStr | None = None

    # The turn.
    daily_token_quota: int | None = Field(
        default=None, description="default per-actor daily token budget when the app sets none"
    )
    diagnostics: bool = True

    # The durable runner.
    step_max_attempts: int = 3  # deliveries of one step before the run fails (a dead letter)
    step_time_limit: float = 300.0  # hard limit of one step task, seconds
    step_lease: float = 30.0  # a started step's lease, extended while it runs
    # The fast path: the step a pass schedules runs at once in the task that scheduled it
    # (of a fan-out, one member; the others are sent). A chain of such steps starts no
    # new step after `eager_budget` seconds or `eager_max_steps` steps: the next is sent.
    eager_steps: bool = True
    eager_budget: float = 30.0
    eager_max_steps: int = 100
    # A run's loop waits in the worker process between passes (in a greenlet),
    # so the next pass there goes on from where it stopped instead of replaying.
    sticky_loops: bool = True
    sticky_idle: float = Field(default=60.0, gt=0)  # then the next pass replays it
    # Database connections a worker process keeps (10 more on a burst): by default, as
    # many as a threads or gevent pool runs tasks at once, up to 20, plus two; 5 in a
    # prefork pool process, which runs one task at a time.
    db_pool_size: int | None = Field(default=None, ge=1)
    # A worker process that has not said it lives for this long is dead: another sends
    # its steps again (runners/durable/liveness.py).
    process_timeout: float = Field(default=3.0, gt=0)
    sweep_interval: float = 30.0  # how often beat runs the sweep
    sweep_stale_after: float = 60.0  # a run with no progress for this long is re-driven
    # Schedules (docs/schedules.md): how often beat (or the embedded default's ticker)
    # looks for due occurrences, and how late one may start and still be on time (for
    # `catch_up="none"`: later, it was missed and is skipped).
    schedule_interval: float = Field(default=1.0, gt=0)
    schedule_grace: float = Field(default=60.0, ge=0)
    # Sleeping runs (agent_jobs/timers.py): the longest a `wait` may sleep, in seconds, and
    # how often beat looks in Postgres for the sleepers whose time comes next.
    max_sleep: float = Field(default=7 * 86400.0, gt=0)
    timer_interval: float = Field(default=1.0, gt=0)
    # Retention (agent_jobs/retention.py): with `prune_after_days` set, beat prunes every
    # `prune_interval` seconds the runs that ended that many days ago (their journals,
    # events, streams, delivered notifications), `prune_batch` runs a transaction, resting
    # `prune_rest` times as long as each batch took before the next.
    prune_after_days: float | None = Field(default=None, ge=0)
    prune_interval: float = Field(default=3600.0, gt=0)
    prune_batch: int = Field(default=100, ge=1)
    prune_rest: float = Field(default=1.0, ge=0)
    # Large payloads (agent_jobs/store/blobs.py): a stored value over `payload_inline_limit`
    # bytes goes to a table of its own, addressed by its SHA-256; one over `payload_max`
    # fails its step instead of reaching the journal.
    payload_inline_limit: int = Field(default=256 * 1024, ge=1024)
    payload_max: int = Field(default=32 * 1024 * 1024, ge=1024)
    # Patches this deployment must not take yet (comma-separated ids): an operator can
    # hold back a new loop shape, and new runs then record the old one.
    disabled_patches: str = ""

    # The model provider failing: the default of the request-error waterfall.
    model_max_retries: int = 3
    model_retry_base_delay: float = 1.0  # seconds; doubled per retry, with jitter
    model_retry_max_delay: float = 60.0
    # Provider rate limits shared by every worker (agent_jobs/ratelimits): model keys
    # (`provider:model` globs, the first that matches wins) to requests and tokens per
    # minute, as JSON. Empty: off, and no Redis command is spent on them.
    rate_limits: Annotated[dict[str, RateLimit], NoDecode] = Field(default_factory=dict)

    # The live stream.
    stream_maxlen: int = 10_000
    stream_ttl: int = 3600

    # Notifications (agent_jobs/notify): a run that ends or starts waiting for a person
    # goes from the outbox to the Redis Stream `agent_jobs:events` (about
    # `events_maxlen` entries kept) and, with `webhook_url`, is POSTed there signed with
    # `webhook_secret` (required with a URL), retried with backoff until a 2xx.
    webhook_url: str | None = None
    webhook_secret: SecretStr | None = None
    webhook_timeout: float = Field(default=10.0, gt=0)  # seconds, each POST
    webhook_retry_base_delay: float = Field(default=1.0, gt=0)  # doubled per retry
    webhook_retry_max_delay: float = Field(default=300.0, gt=0)  # the longest wait
    events_maxlen: int = Field(default=100_000, ge=1)
    notify_poll_interval: float = Field(default=1.0, gt=0)  # looks for others' rows
    notify_retention: float = Field(default=7 * 86400.0, gt=0)  # delivered rows kept

    # Metrics and traces (agent_jobs/observability/: metrics.py, tracing.py): off by default.
    # Set, workers, the approvals listener and `serve` serve Prometheus metrics on this
    # port, at `metrics_addr`; a scrape then needs `Authorization: Bearer <metrics_token>`
    # when the token is set, and an address other than loopback needs the token.
    metrics_port: int | None = Field(default=None, ge=1, le=65535)
    metrics_addr: str = "127.0.0.1"
    metrics_token: SecretStr | None = None
    # A span for every step, exported as the standard `OTEL_*` variables say.
    otel: bool = False

    # The HTTP API (`agent-jobs serve`). `api_tokens` is a JSON object of bearer token to
    # actor: a secret, never logged or shown.
    api_tokens: SecretStr | None = None
    api_keepalive: float = Field(default=15.0, gt=0)  # seconds of quiet before a comment
    api_inbox_poll: float = Field(default=1.0, gt=0)  # seconds between inbox checks
    api_max_streams: int = Field(default=200, ge=1)  # event streams open at once
    # Of which one actor may hold (None: half of them).
    api_max_streams_per_actor: int | None = Field(default=None, ge=1)
    # Seconds a connection has to finish a request's headers (from its start, or from
    # its last answer's end), and the connections `serve` holds at once (fewer if the
    # open-files limit would run out first): http/connections.py.
    api_header_timeout: float = Field(default=10.0, gt=0)
    api_max_connections: int = Field(default=1000, ge=1)
    # Runs one actor may have going in `serve` without a broker (each holds a thread).
    api_inline_runs_per_actor: int = Field(default=50, ge=1)

    # Encryption at rest (docs/security.md, "Encryption at rest"): a JSON object of master
    # key id to the base64 of 32 random bytes (a secret: never logged or shown), and the id
    # of the one that wraps new data keys. Unset: nothing is encrypted.
    encryption_keys: SecretStr | None = None
    encryption_key_id: str | None = None

    @field_validator("rate_limits", mode="before")
    @classmethod
    def _rate_limits(cls, value: object) -> object:
        return parse_rate_limits(value)

    @property
    def effective_redis_url(self) -> str | None:
        return self.redis_url or self.broker_url

    @property
    def durable(self) -> bool:
        return bool(self.broker_url)

    @property
    def disabled_patch_ids(self) -> frozenset[str]:
        return frozenset(p.strip() for p in self.disabled_patches.split(",") if p.strip())


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    """The process-wide settings, read once."""
    return Settings()
