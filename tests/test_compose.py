"""docker-compose.yml, checked without Docker: real entry points, health checks, no secrets."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
COMPOSE: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, Any]] = COMPOSE["services"]
# Services built from this project's image, and what each must run.
OURS = {
    "migrate": ["agent-jobs", "db", "upgrade"],
    "worker": ["celery", "-A", "tasks", "--quiet", "worker"],
    "worker-cpu": ["celery", "-A", "tasks", "--quiet", "worker"],
    "beat": ["celery", "-A", "tasks", "--quiet", "beat"],
    "listener": ["agent-jobs", "approvals", "listen"],
    "flower": ["celery", "-A", "tasks", "flower"],
}
LONG_RUNNING = ["postgres", "redis", "worker", "beat", "listener", "flower"]
# `${NAME}`, `${NAME:-default}`, `${NAME:?message}` and friends.
INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Z0-9_]+)(?:(?P<op>:?[-?+])(?P<arg>[^}]*))?\}")
SECRET_NAME = re.compile(r"PASSWORD|SECRET|KEY|TOKEN|AUTH", re.IGNORECASE)


def interpolate(text: str) -> str:
    """What compose would run, with a stand-in for every variable."""
    return INTERPOLATION.sub(lambda m: f"x{m.group('name').lower()}", text)


def help_exit_code(command: list[str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_JOBS_")}
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
    for service in ("worker", "worker-cpu", "listener"):
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
    flower = " ".join(SERVICES["flower"]["command"])
    auth = re.search(r"--basic-auth=(\$\{[^}]*\}):(\$\{[^}]*\})$", flower)
    assert auth, "flower must sit behind basic auth, user and password from the environment"


def test_required_secrets_refuse_to_start_unset_and_stay_where_needed() -> None:
    text = (ROOT / "docker-compose.yml").read_text()
    for name in (
        "POSTGRES_PASSWORD",
        "AGENT_JOBS_APPROVAL_SECRET",
        "FLOWER_USER",
        "FLOWER_PASSWORD",
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
