"""Restate beside agent-jobs (`python -m bench.peers restate`): W1, W2 and W3 as one
durable handler whose model calls and reads are each a journaled `ctx.run`.

The server is restate-server from npm (`npm ci --prefix bench/restate --ignore-scripts`:
the version bench/restate/package-lock.json pins), one node at its defaults (its log
and partitions on RocksDB with fsync on, replication 1), in a temporary directory that
is removed after; telemetry and the web UI are off, and it listens on free ports of
127.0.0.1 only. The handler is served by the Python SDK on hypercorn in a process of its
own (`python -m bench.peers_restate PORT`), reached over HTTP/2 as Restate does by
default; its limit of HTTP/2 streams at once, each an invocation in flight, is raised
from hypercorn's 100 so that W3's runs are not queued behind it. This process registers
the deployment and calls the handler through the ingress, each run a request whose
response is the run's answer.
"""

from __future__ import annotations

import asyncio
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import restate

from bench.peers import Served, check, free_port, model_async, read_async, server

ROOT = Path(__file__).resolve().parent.parent
ARCH = {"x86_64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(platform.machine(), "x64")
SERVER = (
    ROOT / f"bench/restate/node_modules/@restatedev/restate-server-linux-{ARCH}/bin/restate-server"
)
STREAMS = 10_000  # HTTP/2 streams at once on the service's connection: invocations in flight

agent = restate.Service("Agent")


@agent.handler()
async def run(ctx: restate.Context, request: dict[str, Any]) -> dict[str, Any]:
    """The agent's loop: a model turn, then its reads together, until the model answers."""
    plan = request["plan"]
    history: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for turn in range(10):
        reply = await ctx.run_typed(f"model {turn}", model_async, restate.RunOptions(), plan, turn)
        history.append({"role": "assistant", **reply})
        if not reply["tool_calls"]:
            return {"text": reply["text"], "messages": len(history)}
        calls = reply["tool_calls"]
        reads = [
            ctx.run_typed(c["id"], read_async, restate.RunOptions(), c["name"], c["args"])
            for c in calls
        ]
        await restate.gather(*reads)
        history += [
            {"role": "tool", "id": c["id"], "content": await r}
            for c, r in zip(calls, reads, strict=True)
        ]
    raise restate.TerminalError("the script never answered")


app = restate.app(services=[agent])


def config(data: Path, ingress: int, admin: int, fabric: int) -> str:
    """One node on 127.0.0.1, everything else at the server's defaults."""
    return f"""\
node-name = "bench"
cluster-name = "agent-jobs-bench"
base-dir = "{data}"
listen-mode = "tcp"
bind-address = "127.0.0.1:{fabric}"
advertised-address = "http://127.0.0.1:{fabric}/"
disable-telemetry = true

[ingress]
bind-address = "127.0.0.1:{ingress}"
advertised-ingress-endpoint = "http://127.0.0.1:{ingress}/"

[admin]
bind-address = "127.0.0.1:{admin}"
disable-web-ui = true
"""


async def _retry(call: Any, what: str, seconds: float = 120) -> Any:
    """`call()` until it succeeds: the server takes a moment to lead its partitions."""
    deadline = asyncio.get_running_loop().time() + seconds
    while True:
        try:
            return await call()
        except httpx.HTTPError:
            if asyncio.get_running_loop().time() > deadline:
                raise SystemExit(f"Restate: {what} still failing after {seconds} s") from None
            await asyncio.sleep(0.5)


@asynccontextmanager
async def serve() -> AsyncIterator[Served]:
    """restate-server and the service up, the deployment registered; down on the way out."""
    if not SERVER.exists():
        raise SystemExit(f"no {SERVER}: npm ci --prefix bench/restate --ignore-scripts")
    ingress, admin, fabric, service = (free_port() for _ in range(4))
    with tempfile.TemporaryDirectory(prefix="bench-restate-") as tmp:
        home = Path(tmp)
        (home / "restate.toml").write_text(config(home / "data", ingress, admin, fabric))
        args = [str(SERVER), "--config-file", "restate.toml", "--log-disable-ansi-codes", "true"]
        serving = [sys.executable, "-m", "bench.peers_restate", str(service)]
        env = os.environ | {
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
        }
        with (
            server(args, [admin, ingress], home) as restate_server,
            # It keeps nothing (a run's state is the server's), and the SDK's answer to
            # SIGTERM is to wait for Restate's connection to drain: it is killed.
            server(serving, [service], home, env, signal.SIGKILL) as service_proc,
        ):
            # The runs go over HTTP/2 (h2c), each a stream of one connection: over HTTP/1.1
            # W3's thousand connections at once cost this process more CPU than Restate
            # takes. Set-up goes over HTTP/1.1, which a refused first try cannot wedge.
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
            async with (
                httpx.AsyncClient(timeout=60) as setup,
                httpx.AsyncClient(timeout=900, limits=limits, http1=False, http2=True) as http,
            ):

                async def register() -> None:
                    url = f"http://127.0.0.1:{admin}/deployments"
                    body = {"uri": f"http://127.0.0.1:{service}", "force": True}
                    (await setup.post(url, json=body)).raise_for_status()

                async def call(plan: str, client: httpx.AsyncClient = http) -> httpx.Response:
                    url = f"http://127.0.0.1:{ingress}/Agent/run"
                    return (await client.post(url, json={"plan": plan})).raise_for_status()

                async def run_plan(plan: str) -> dict[str, Any]:
                    result: dict[str, Any] = (await call(plan)).json()
                    return result

                async def record() -> int:
                    """The journal entries of a W1 run, as the server's SQL sees them."""
                    invocation = (await call("w1")).headers["x-restate-id"]
                    sql = f"SELECT count(*) AS n FROM sys_journal WHERE id = '{invocation}'"
                    return int((await query(sql))[0]["n"])

                async def query(sql: str) -> list[dict[str, Any]]:
                    response = await setup.post(
                        f"http://127.0.0.1:{admin}/query",
                        json={"query": sql},
                        headers={"accept": "application/json"},
                    )
                    rows: list[dict[str, Any]] = response.raise_for_status().json()["rows"]
                    return rows

                async def completed() -> int:
                    sql = (
                        "SELECT count(*) AS n FROM sys_invocation_status WHERE status = 'completed'"
                    )
                    return int((await query(sql))[0]["n"])

                async def w3(runs: int) -> float:
                    """W3's runs started as ours are: each sent (the ingress answers once the
                    server holds it durably), then the server asked every 0.2 s how many
                    have completed. The makespan; each run's answer is checked after."""
                    before = await completed()
                    gate = asyncio.Semaphore(16)
                    started = time.perf_counter()

                    async def send() -> str:
                        async with gate:
                            url = f"http://127.0.0.1:{ingress}/Agent/run/send"
                            response = await http.post(url, json={"plan": "w3"})
                            return str(response.raise_for_status().json()["invocationId"])

                    sent = await asyncio.gather(*(send() for _ in range(runs)))
                    while await completed() - before < runs:
                        await asyncio.sleep(0.2)
                    makespan = time.perf_counter() - started
                    for invocation in sent:
                        url = f"http://127.0.0.1:{ingress}/restate/invocation/{invocation}/output"
                        check("w3", (await setup.get(url)).raise_for_status().json())
                    return makespan

                await _retry(register, "registering the service")
                await _retry(lambda: call("w1", setup), "the first run")
                await run_plan("w1")
                processes = {"client": os.getpid(), "service": service_proc.pid}
                processes["server"] = restate_server.pid
                yield Served(run_plan, processes, record, w3)


def main() -> None:
    """The service's own process: the handler on hypercorn, on 127.0.0.1:PORT."""
    from hypercorn.asyncio import serve as hypercorn_serve
    from hypercorn.config import Config

    hyper = Config()
    hyper.bind = [f"127.0.0.1:{int(sys.argv[1])}"]
    hyper.accesslog = None
    hyper.loglevel = "WARNING"
    hyper.h2_max_concurrent_streams = STREAMS
    asyncio.run(hypercorn_serve(app, hyper))  # type: ignore[arg-type]


if __name__ == "__main__":
    main()
