"""docker-compose.yml, checked without Docker: real entry points, health checks, no secrets."""

from __future__ import annotations

import glob
import logging
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import encryption as test_encryption
from tests.support.hosts import as_postgres

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
# Services built from this project's image, and what each must run.
OURS = {
    "migrate": ["agent-jobs", "db", "upgrade"],
    "worker": ["celery", "-A", "agent_jobs.worker", "--quiet", "worker"],
    "worker-cpu": ["celery", "-A", "agent_jobs.worker", "--quiet", "worker"],
    "beat": ["celery", "-A", "agent_jobs.worker", "--quiet", "beat"],
    "listener": ["agent-jobs", "approvals", "listen"],
    "flower": ["celery", "-A", "agent_jobs.worker", "flower"],
    "api": ["agent-jobs", "serve"],
}
LONG_RUNNING = ["postgres", "redis", "worker", "beat", "listener", "flower", "api"]
# `${NAME}`, `${NAME:-default}`, `${NAME:?message}` and friends.
INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Z0-9_]+)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|KEY|TOKEN|AUTH", re.IGNORECASE)


def interpolate(text: str) -> str:
    """What compose would run, with a stand-in for every variable."""
    return INTERPOLATION.sub(lambda m: f"x{m.group('name').lower()}", text)


def help_exit_code(command: list[str]) -> subprocess.CompletedProcess[str]:
    env = test_encryption.bare_environ()
    argv = [str(BIN / command[0]), *[interpolate(a) for a in command[1:]], "--help"]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_the_stack_has_every_service() -> None:
    assert set(SERVICES) == {"postgres", "redis", *OURS}
    for name in OURS:
        assert SERVICES[name]["build"] == "." and SERVICES[name]["image"] == "agent-jobs:latest"
    assert (ROOT / "Dockerfile").exists()


@pytest.mark.parametrize("service", sorted(OURS))
def test_each_command_is_a_real_entry_point_of_this_project(service: str) -> None:
    command: list[str] = SERVICES[service]["command"]
    assert isinstance(command, list), "exec form: no shell between compose and the process"
    assert command[: len(OURS[service])] == OURS[service]
    assert (BIN / command[0]).exists(), f"{command[0]} is not installed by this project"
    done = help_exit_code(command)
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("service", LONG_RUNNING)
def test_each_long_running_service_has_a_health_check(service: str) -> None:
    test = SERVICES[service]["healthcheck"]["test"]
    assert test[0] in ("CMD", "CMD-SHELL")
    if test[0] == "CMD" and test[1] == "python":
        compile(test[3], f"{service} healthcheck", "exec")
    elif test[0] == "CMD-SHELL" and test[1].startswith("celery"):
        command = shlex.split(test[1].replace("$$", "$"))
        assert help_exit_code(command).returncode == 0


def test_the_worker_serves_llm_shaped_work_and_cpu_bound_tools_have_their_own() -> None:
    worker, cpu = SERVICES["worker"]["command"], SERVICES["worker-cpu"]["command"]
    assert "--pool=threads" in worker and "--concurrency=100" in worker
    assert "--pool=prefork" in cpu and "--queues=agent_jobs_cpu" in cpu
    assert SERVICES["worker-cpu"]["profiles"] == ["cpu"]


def test_services_wait_for_what_they_need() -> None:
    assert SERVICES["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    for service in ("worker", "worker-cpu", "listener", "api"):
        needs = SERVICES[service]["depends_on"]
        assert needs["migrate"]["condition"] == "service_completed_successfully"
        assert needs["redis"]["condition"] == "service_healthy"
    assert SERVICES["migrate"]["restart"] == "no"


def environment_values() -> list[tuple[str, str, str]]:
    found = []
    for name, service in SERVICES.items():
        env = service.get("environment") or {}
        assert isinstance(env, dict), f"{name}: environment as a mapping"
        found += [(name, key, str(value)) for key, value in env.items()]
    return found


def test_no_secret_is_written_in_the_file() -> None:
    for service, key, value in environment_values():
        if SECRET_NAME.search(key):
            match = INTERPOLATION.fullmatch(value)
            assert match, f"{service}.{key} must come from the environment, not the file"
            assert match.group("op") in (None, ":?", "?", ":-", "-")
            if match.group("op") in (":-", "-"):
                assert match.group("arg") == "", f"{service}.{key} has a default secret"
        for url in re.findall(r"[a-z+]+://[^\s]+", value):
            password = re.match(r"[a-z+]+://[^:/@]+:([^@]+)@", url)
            if password:
                assert INTERPOLATION.fullmatch(password.group(1)), f"{service}.{key}: password"


def command_lines(service: dict[str, Any]) -> list[str]:
    """Every argument a service's container runs with, its health check's too."""
    found: list[str] = []
    for key in ("command", "entrypoint"):
        value = service.get(key) or []
        found += [value] if isinstance(value, str) else [str(arg) for arg in value]
    found += [str(arg) for arg in (service.get("healthcheck") or {}).get("test") or []]
    return found


@pytest.mark.parametrize("service", sorted(SERVICES))
def test_no_secret_is_on_a_command_line(service: str) -> None:
    # A command line is in `ps` for anyone on the host, and `docker inspect` shows it.
    for arg in command_lines(SERVICES[service]):
        for use in INTERPOLATION.finditer(arg):
            assert not SECRET_NAME.search(use.group("name")), f"{service}: {arg}"
        assert not re.search(r"--(basic-auth|password)|://[^/\s]*:[^/\s]*@", arg), arg


def test_flower_sits_behind_basic_auth_from_its_environment_on_the_hosts_loopback() -> None:
    flower = SERVICES["flower"]
    assert "--conf=/etc/agent-jobs/flowerconfig.py" in flower["command"]
    assert not [a for a in flower["command"] if a.startswith("--basic-auth")]
    env = flower["environment"]
    for name in ("FLOWER_USER", "FLOWER_PASSWORD"):
        assert env[name] == f"${{{name}:?set {name}}}"
    # Flower applies a `FLOWER_<OPTION>` variable itself (FLOWER_BASIC_AUTH split on `,`):
    # the user and the password are no option of it, so only the config file reads them.
    from flower.options import default_options

    assert not [k for k in env if k.startswith("FLOWER_") and k[7:].lower() in default_options]
    # Plain HTTP: published on the host's loopback alone (TLS goes in front to go further).
    assert flower["ports"] == ["127.0.0.1:5555:5555"]
    # The config file is where the image puts it: linked to the one the package ships.
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert (
        "/tasks/flowerconfig.py" in dockerfile and "/etc/agent-jobs/flowerconfig.py" in dockerfile
    )
    assert (ROOT / "tasks" / "flowerconfig.py").exists()


def test_the_database_password_is_no_part_of_a_url() -> None:
    holders = [(s, v) for s, key, v in environment_values() if key == "AGENT_JOBS_DATABASE_URL"]
    assert holders
    for service, url in holders:
        assert "@postgres:5432/" in url and ":" not in url.split("://", 1)[1].split("@")[0], service
        env = SERVICES[service]["environment"]
        assert env["AGENT_JOBS_DATABASE_PASSWORD"] == "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"


# --- the database password, as compose passes it, against a real server that asks for it ---

# Every character that breaks a password written into a URL.
DB_PASSWORD = "p@ss,w:rd/?#%" + uuid.uuid4().hex[:8]


@pytest.fixture
def scram_postgres() -> Iterator[str]:
    """A Postgres cluster of the test's own that asks for a password (scram-sha-256) on a
    free port; yields its URL, which names no password."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        pytest.fail("the test needs PostgreSQL's initdb (/usr/lib/postgresql/*/bin/initdb)")
    bin_dir = Path(found[-1]).parent
    # Not under pytest's tmp_path: its folders are the tester's own (0700), and the
    # server runs as `postgres`.
    home = Path(tempfile.mkdtemp(prefix="agent-jobs-scram-"))
    home.chmod(0o755)
    password_file = home / "password"
    password_file.write_text(DB_PASSWORD)  # initdb reads it: the password is on no command line
    if os.geteuid() == 0:
        shutil.chown(home, "postgres", "postgres")
        shutil.chown(password_file, "postgres", "postgres")
    password_file.chmod(0o600)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    data, log = home / "data", home / "server.log"
    ctl = [str(bin_dir / "pg_ctl"), "-D", str(data)]

    def run(argv: list[str]) -> None:
        done = subprocess.run(as_postgres(argv), capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{argv[0]}: {done.stdout}{done.stderr}"

    try:
        run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                "agent_jobs",
                "--auth=scram-sha-256",
                f"--pwfile={password_file}",
                "--encoding=UTF8",
            ]
        )
        options = f"-p {port} -k {home} -c listen_addresses=127.0.0.1"
        run([*ctl, "-l", str(log), "-o", options, "-w", "start"])
        yield f"postgresql+psycopg://agent_jobs@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            as_postgres([*ctl, "-m", "immediate", "stop"]), capture_output=True, timeout=60
        )
        shutil.rmtree(home, ignore_errors=True)


def test_a_database_password_with_url_characters_reaches_postgres_intact(
    scram_postgres: str,
) -> None:
    # No password from anywhere else libpq looks (PGPASSWORD, a ~/.pgpass).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGENT_JOBS_", "PG"))}
    env.update(AGENT_JOBS_DATABASE_URL=scram_postgres, PGPASSFILE=os.devnull)

    def upgrade(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "agent-jobs"), "db", "upgrade"],
            cwd=ROOT,
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )

    # The server asks for the password: without it, or with another, nothing is done.
    for extra in ({}, {"AGENT_JOBS_DATABASE_PASSWORD": DB_PASSWORD[:-1]}):
        refused = upgrade(**extra)
        assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
        said = refused.stderr
        assert "no password supplied" in said or "password authentication failed" in said, said
    # Given as the setting, the whole password gets through, and is shown nowhere.
    done = upgrade(AGENT_JOBS_DATABASE_PASSWORD=DB_PASSWORD)
    assert done.returncode == 0, done.stderr
    assert "database at revision" in done.stdout
    assert DB_PASSWORD not in done.stdout + done.stderr
    # What compose did before: the password written into the URL, which it breaks.
    user, rest = scram_postgres.split("://", 1)[1].split("@", 1)
    inline = f"postgresql+psycopg://{user}:{DB_PASSWORD}@{rest}"
    broken = upgrade(AGENT_JOBS_DATABASE_URL=inline)
    assert broken.returncode == 2 and "is not a database URL" in broken.stderr, broken.stderr


def test_the_database_password_is_set_on_the_url_and_masked() -> None:
    from pydantic import SecretStr

    from agent_jobs.logs import JsonFormatter
    from agent_jobs.store.db import make_engine

    engine = make_engine(
        "postgresql://agent_jobs@db.invalid/agent_jobs", password=SecretStr(DB_PASSWORD)
    )
    try:
        assert engine.url.password == DB_PASSWORD and engine.url.host == "db.invalid"
        assert DB_PASSWORD not in str(engine.url) and DB_PASSWORD not in repr(engine.url)
    finally:
        engine.dispose()
    record = logging.LogRecord("x", logging.INFO, __file__, 1, f"said {DB_PASSWORD}", (), None)
    assert DB_PASSWORD not in JsonFormatter(redact=[DB_PASSWORD]).format(record)


def test_required_secrets_refuse_to_start_unset_and_stay_where_needed() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    for name in (
        "POSTGRES_PASSWORD",
        "AGENT_JOBS_APPROVAL_SECRET",
        "FLOWER_USER",
        "FLOWER_PASSWORD",
        "AGENT_JOBS_API_TOKENS",
    ):
        uses = [m for m in INTERPOLATION.finditer(text) if m.group("name") == name]
        assert uses and all(m.group("op") == ":?" for m in uses), f"{name} must be required"
    holders = [s for s, key, _ in environment_values() if key == "AGENT_JOBS_APPROVAL_SECRET"]
    assert holders == ["listener"]
    assert "AGENT_JOBS_DATABASE_URL" not in (SERVICES["flower"].get("environment") or {})


def test_the_dockerfile_copies_what_exists_and_drops_root() -> None:
    lines = (ROOT / "Dockerfile").read_text().splitlines()
    for line in lines:
        if line.startswith("COPY "):
            for source in line.split()[1:-1]:
                assert (ROOT / source).exists(), source
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] != "root"
    # The api service runs `agent-jobs serve`, whose extra the image must carry, and the
    # workers run models of either provider, whose SDKs are extras too.
    assert "pip install '.[api,metrics,otel,openai,anthropic]'" in "\n".join(lines)


def test_the_api_is_published_on_the_hosts_loopback_only_with_tokens_from_the_environment() -> None:
    api = SERVICES["api"]
    assert api["ports"] == ["127.0.0.1:8000:8000"]
    assert "--host" in api["command"] and "0.0.0.0" in api["command"]  # inside its container
    assert api["environment"]["AGENT_JOBS_API_TOKENS"].startswith("${AGENT_JOBS_API_TOKENS:?")
    assert not any("TOKEN" in arg for arg in api["command"])
    holders = [s for s, key, _ in environment_values() if key == "AGENT_JOBS_API_TOKENS"]
    assert holders == ["api"]


def test_the_documented_exports_give_every_variable_compose_requires() -> None:
    """`docker compose up -d` as the guide gives it once failed: the api service needs
    AGENT_JOBS_API_TOKENS, which neither the guide's export line nor the file's header
    listed. Compose refuses to start while a `${NAME:?…}` is unset or empty."""
    text = (ROOT / "docker-compose.yml").read_text()
    required = {m.group("name") for m in INTERPOLATION.finditer(text) if m.group("op") == ":?"}
    page = (ROOT / "docs" / "operating.md").read_text()
    [block] = [b for b in re.findall(r"```sh\n(.*?)```", page, re.S) if "compose up -d" in b]
    exported: dict[str, str] = {}
    for line in block.splitlines():
        if line.startswith("export "):
            for word in shlex.split(line)[1:]:
                name, _, value = word.partition("=")
                exported[name] = value
    assert {name for name in required if exported.get(name)} == required, exported
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert all(name in header for name in required), sorted(required)
