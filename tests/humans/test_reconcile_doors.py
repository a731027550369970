"""The doors to a call whose outcome is unknown: `agent-jobs reconcile`, `status --json`,
`runs`, and `POST /v1/runs/{run_id}/reconcile/{call_id}` of `agent-jobs serve`. Every
refusal is checked for what it says and for having changed nothing."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from agent_jobs.store.schema import outbox
from tests.humans.test_reconcile import APP, Outcomes, kill_the_process, parked_after_a_kill
from tests.support.cluster import Cluster
from tests.support.serve import ApiServer, api_env, assert_error


@pytest.mark.pools_named  # the doors, not the pool: once
def test_a_call_awaiting_reconciliation_through_the_doors(cluster: Cluster, tmp_path: Path) -> None:
    outcomes = Outcomes(cluster, tmp_path)
    outcomes.worker(restart=True)
    outcomes.worker(restart=True)
    api = ApiServer(api_env(outcomes.env(), AGENT_JOBS_APP=APP), "serve-reconcile")
    cluster.procs.append(api.proc)
    api.start()

    run_id = parked_after_a_kill(outcomes, "payer", "pay", kill_the_process)
    path = f"/v1/runs/{run_id}/reconcile/call_1"
    before = outcomes.snapshot(run_id)

    # Its notification, written with the status that parked it (the outbox).
    with cluster.store.connect() as conn:
        notices = conn.execute(
            select(outbox.c.type, outbox.c.body).where(outbox.c.run_id == run_id)
        )
        [(kind, body)] = [n for n in notices if n.type != "run.awaiting_approval"]
    assert kind == "run.outcome_unknown"
    assert (body["call_id"], body["tool"], body["args"]) == ("call_1", "pay", {"order_id": "A1"})

    # Where it shows: status --json, runs, the HTTP API's run document.
    shown = outcomes.cli("status", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    doc = json.loads(shown.stdout)
    assert doc["status"] == "awaiting_reconcile"
    assert doc["waiting_on"] == "awaiting_reconcile pay call_1"
    listed = outcomes.cli("runs")
    assert f"{run_id}  awaiting_reconcile" in listed.stdout, listed.stdout
    with api.client("alice") as http:
        assert http.get(f"/v1/runs/{run_id}").json()["status"] == "awaiting_reconcile"
        assert (
            path.replace(run_id, "{run_id}").replace("call_1", "{call_id}")
            in (http.get("/openapi.json").json()["paths"])
        )

    # The command line refuses, changing nothing.
    for args, code, said in (
        (["--succeeded", "{not json"], 2, "--succeeded takes the call's result as JSON"),
        (["--retry", "--failed", "no"], 2, "exactly one of"),
        ([], 2, "exactly one of"),
        (["--retry", "--actor", "eve"], 2, "may not say how call call_1 (pay) ended"),
    ):
        refused = outcomes.cli("reconcile", run_id, "call_1", *args)
        assert refused.returncode == code, (args, refused.stdout, refused.stderr)
        assert said in refused.stderr, (args, refused.stderr)
    unknown_run = outcomes.cli("reconcile", "no-such-run", "call_1", "--retry")
    assert unknown_run.returncode == 3 and "no run with id" in unknown_run.stderr
    unknown_call = outcomes.cli("reconcile", run_id, "call_9", "--retry", "--actor", "alice")
    assert unknown_call.returncode == 2 and "has no tool call 'call_9'" in unknown_call.stderr
    assert outcomes.snapshot(run_id) == before

    # So does the HTTP API.
    def post(actor: str, body: object, where: str = path) -> httpx.Response:
        with api.client(actor) as http:
            return http.post(where, json=body)

    assert_error(post("eve", {"outcome": "retry"}), 404, "UnknownRunError")
    said = assert_error(post("user-7", {"outcome": "retry"}), 403, "PermissionDeniedError")
    assert "may not say how call call_1 (pay) ended" in said
    assert_error(post("alice", {"outcome": "retry"}, path.replace("call_1", "call_9")), 404)
    assert_error(post("alice", {"outcome": "retry"}, "/v1/runs/nope/reconcile/call_1"), 404)
    for body in (
        {"outcome": "succeeded"},
        {"outcome": "failed"},
        {"outcome": "maybe"},
        {"outcome": "retry", "error": "why"},
        {"outcome": "failed", "error": "no", "result": 1},
        {"outcome": "retry", "extra": True},
    ):
        assert_error(post("alice", body), 422, "InvalidRequestError")
    assert outcomes.snapshot(run_id) == before

    # A call that is not awaiting reconciliation: 409 (its approval is pending).
    waiting_approval = outcomes.client.enqueue_run("payer", "go", actor="user-7")
    outcomes.wait_status(waiting_approval, "awaiting_approval")
    other = f"/v1/runs/{waiting_approval}/reconcile/call_1"
    said = assert_error(post("alice", {"outcome": "retry"}, other), 409, "ConflictError")
    assert "not awaiting reconciliation" in said
    refused = outcomes.cli("reconcile", waiting_approval, "call_1", "--retry", "--actor", "alice")
    assert refused.returncode == 2 and "not awaiting reconciliation" in refused.stderr
    assert outcomes.client.get_run(waiting_approval).status == "awaiting_approval"

    # The first decision wins: the run goes on with it, and a second one is refused.
    recorded = post("backend", {"outcome": "succeeded", "result": {"paid": "A1"}})
    assert recorded.status_code == 200 and recorded.json() == {"recorded": True}
    assert cluster.wait(run_id).status == "completed"
    assert_error(post("alice", {"outcome": "failed", "error": "late"}), 409, "ConflictError")
    late = outcomes.cli("reconcile", run_id, "call_1", "--failed", "late", "--actor", "alice")
    assert late.returncode == 2 and "has ended" in late.stderr
    assert json.loads(outcomes.tool_message(run_id).content) == {"paid": "A1"}
    assert len(outcomes.starts(run_id, "pay")) == 1
    outcomes.close()
