"""Starting the server: the `api` extra, the tokens setting, `uvicorn agent_jobs.http:app`,
and `/healthz` when the database goes away and comes back."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.support import encryption as test_encryption
from tests.support.serve import TOKENS, TOKENS_JSON, ApiServer, Proxy, api_env, assert_error
from tests.support.workers import ROOT

SECRET_TOKEN = "do-not-print-me-0123456789abcdef"


def plain_env(tmp: Path, **extra: str) -> dict[str, str]:
    base = test_encryption.bare_environ()
    env = {
        **base,
        "PYTHONPATH": str(ROOT),
        "AGENT_JOBS_APP": "tests.support.apps.http:app",
        "AGENT_JOBS_DATABASE_URL": f"sqlite:///{tmp / 'agent_jobs.db'}",
    }
    return {**env, **extra}


def python(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# Python refuses to import a module whose entry in sys.modules is None: the extra's
# packages are as good as not installed.
WITHOUT_THE_EXTRA = "import sys\nsys.modules['fastapi'] = sys.modules['uvicorn'] = None\n"


def test_serve_without_the_api_extra_says_which_extra_to_install(tmp_path: Path) -> None:
    env = plain_env(tmp_path, AGENT_JOBS_API_TOKENS=TOKENS_JSON)
    code = WITHOUT_THE_EXTRA + "from agent_jobs.cli import main\nmain(['serve'])\n"
    done = python(code, env)
    assert done.returncode == 2, done.stderr
    assert (
        done.stderr.strip()
        == "error: the HTTP API needs the api extra: pip install 'agent-jobs[api]'"
    )
    # The rest of the command line, and the package itself, do without it.
    code = (
        WITHOUT_THE_EXTRA
        + "import agent_jobs.http\nfrom agent_jobs.cli import main\nmain(['--help'])\n"
    )
    done = python(code, env)
    assert done.returncode == 0 and "serve" in done.stdout, done.stderr


def test_importing_the_app_module_connects_to_nothing(tmp_path: Path) -> None:
    nowhere = "postgresql+psycopg://nobody:secret@127.0.0.1:9/none"
    env = plain_env(tmp_path, AGENT_JOBS_DATABASE_URL=nowhere)  # and no tokens either
    done = python("import agent_jobs.http\nprint('imported')", env)
    assert done.returncode == 0 and done.stdout.strip() == "imported", done.stderr


@pytest.mark.parametrize(
    ("tokens", "says"),
    [
        (None, "needs AGENT_JOBS_API_TOKENS"),
        (SECRET_TOKEN, "AGENT_JOBS_API_TOKENS is not JSON"),
        (json.dumps([SECRET_TOKEN]), "must be a non-empty JSON object"),
        (json.dumps({SECRET_TOKEN: 7}), "each token's actor must be a string"),
        ("{}", "must be a non-empty JSON object"),
    ],
)
def test_serve_refuses_to_start_without_usable_tokens_and_never_echoes_them(
    tmp_path: Path, tokens: str | None, says: str
) -> None:
    env = plain_env(tmp_path, **({"AGENT_JOBS_API_TOKENS": tokens} if tokens else {}))
    done = subprocess.run(
        [sys.executable, "-m", "agent_jobs.cli", "serve", "--port", "9"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert says in done.stderr and done.stderr.startswith("error: ")
    assert SECRET_TOKEN not in done.stderr + done.stdout


def test_uvicorn_serves_agent_jobs_http_app(tmp_path: Path) -> None:
    env = api_env(plain_env(tmp_path))
    args = [sys.executable, "-m", "uvicorn", "agent_jobs.http:app", "--port", "{port}"]
    server = ApiServer(env, "uvicorn", args=args).start()
    try:
        with server.client("carol") as client:
            assert client.get("/v1/me").json() == {"actor": "carol", "roles": ["lead"]}
        with server.client() as client:
            page = client.get("/")
            assert page.status_code == 200 and "Approval inbox" in page.text
            assert_error(client.get("/v1/approvals"), 401, "AuthenticationError")
    finally:
        server.stop()


@pytest.fixture
def cut_off(pg_url: str, tmp_path: Path) -> Iterator[tuple[ApiServer, Proxy]]:
    """The server (inline) on the session's Postgres, through a proxy that can cut it off."""
    url = make_url(pg_url)
    proxy = Proxy((url.host or "127.0.0.1", url.port or 5432)).mend()
    through = url.set(port=proxy.port).render_as_string(hide_password=False)
    server = ApiServer(api_env(plain_env(tmp_path, AGENT_JOBS_DATABASE_URL=through)), "serve-pg")
    try:
        yield server.start(), proxy
    finally:
        server.stop()
        proxy.cut()


def test_healthz_is_503_while_the_database_is_unreachable(
    cut_off: tuple[ApiServer, Proxy],
) -> None:
    server, proxy = cut_off
    with server.client("user-7") as client:
        assert client.get("/healthz").json() == {"ok": True}
        proxy.cut()
        down = client.get("/healthz")
        assert down.status_code == 503
        assert down.json() == {
            "ok": False,
            "error": "the database is unreachable",
            "type": "ServiceUnavailableError",
        }
        # Every other answer that needs the database says so in the error shape.
        refused = client.get("/v1/approvals")
        assert "the database is unreachable" in assert_error(
            refused, 503, "ServiceUnavailableError"
        )
        proxy.mend()
        assert client.get("/healthz").json() == {"ok": True}
        assert client.get("/v1/approvals").status_code == 200
    assert TOKENS["user-7"] not in server.log()
