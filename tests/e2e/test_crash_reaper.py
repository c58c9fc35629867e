"""The supervisor's reaper returns an attempt whose Prefect flow run ended without landing
(Crashed: its process was killed) at once, without waiting for its lease to expire; an attempt
whose flow run is still running keeps its lease, and one that was requeued meanwhile is left."""

from __future__ import annotations

import uuid
from collections.abc import Callable

import pytest
from prefect import flow, get_client
from prefect.states import Crashed, Running
from sqlalchemy import select

from evalfleet.embedded import EmbeddedStack
from ledger import queue
from ledger.models import InstanceResult, Job
from ledger.runs import NewRun, create_run
from tasks import ledger_io, supervise

pytestmark = [pytest.mark.postgres, pytest.mark.prefect]


@flow(name="reaper-test-instance")
def _placeholder() -> None:
    """Only a flow to create flow runs of; never called."""


def _flow_run(state_name: str) -> str:
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(_placeholder, state=Running())
        if state_name == "crashed":
            client.set_flow_run_state(run.id, Crashed(message="killed -9"), force=True)
    return str(run.id)


def test_a_crashed_flow_run_is_requeued_without_waiting_for_the_lease(
    e2e_env: Callable[..., EmbeddedStack], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVALFLEET_VISIBILITY_TIMEOUT_S", "600")  # the lease is far from expiry
    from evalfleet.settings import get_settings

    get_settings.cache_clear()
    engine = ledger_io.engine()
    run_id = str(uuid.uuid4())
    create_run(
        engine,
        NewRun(
            run_id=run_id,
            name="reaper",
            harness="simulated",
            alias="sim-openai",
            instance_ids=["dead", "alive", "stale"],
            spend_cap_micro_usd=1_000_000,
            max_attempts=3,
        ),
    )
    leases = {lease.instance_id: lease for lease in queue.claim(engine, "harness", 3)}
    assert set(leases) == {"dead", "alive", "stale"}
    flow_runs = {"dead": _flow_run("crashed"), "alive": _flow_run("running")}
    flow_runs["stale"] = _flow_run("crashed")
    for name, lease in leases.items():
        queue.mark_running(engine, lease, flow_run_id=flow_runs[name])
    # "stale": its holder gave the job back itself before the reaper looked
    from ledger.reaper import requeue

    requeue(engine, leases["stale"], "infrastructure: gave up")

    assert supervise.reap() == (1, 0)
    with engine.connect() as conn:
        rows = {
            r.instance_id: r
            for r in conn.execute(
                select(
                    InstanceResult.instance_id,
                    InstanceResult.state,
                    InstanceResult.lease_token,
                    InstanceResult.error_detail,
                ).where(InstanceResult.run_id == run_id)
            )
        }
        visible = dict(
            conn.execute(select(Job.instance_id, Job.lease_token).where(Job.run_id == run_id))
            .tuples()
            .all()
        )
    assert rows["dead"].state == "queued" and rows["dead"].lease_token is None
    assert flow_runs["dead"] in rows["dead"].error_detail
    assert visible["dead"] is None  # claimable again
    assert rows["alive"].state == "running" and visible["alive"] == leases["alive"].token
    assert rows["stale"].state == "queued"  # requeued once, by its holder
    assert supervise.reap() == (0, 0)  # nothing more to do: idempotent
    # the second attempts are claimed: their rows still name the crashed flow runs until they
    # start, and a booting attempt is never judged by an old flow run
    again = queue.claim(engine, "harness", 2, run_id=run_id)
    assert sorted((x.instance_id, x.attempt) for x in again) == [("dead", 2), ("stale", 2)]
    assert supervise.reap() == (0, 0)
