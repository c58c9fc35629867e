"""A ``booting`` attempt whose flow run Prefect reports over (its process killed before the flow
began: the worker marks it Crashed; or Failed / Cancelled) goes back to the queue at the
supervisor's next tick, without waiting for its lease to expire, and the return is audited.

The flow run is found by its name and job reference, as the work-pool launcher creates it
(``<instance> #<attempt>``, parameter ``job``): a flow run still Scheduled, one of another lease
with the same name, and an instance that started meanwhile are left alone.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
from prefect import flow, get_client
from prefect.states import Cancelled, Crashed, Scheduled
from sqlalchemy import select

from evalfleet.embedded import EmbeddedStack
from evalfleet.errors import StaleLease
from evalfleet.states import InstanceState
from ledger import queue
from ledger.models import AuditLog, InstanceResult, Job
from ledger.queue import Lease
from ledger.reaper import requeue
from ledger.runs import NewRun, create_run
from tasks import ledger_io, supervise
from tasks.instance import JobRef

pytestmark = [pytest.mark.postgres, pytest.mark.prefect]


@flow(name="boot-reaper-test-instance")
def _placeholder(job: dict[str, Any]) -> None:
    """Only a flow to create flow runs of; never called."""


def _flow_run(lease: Lease, state: Any, *, token: str | None = None) -> str:
    """A flow run as the work-pool launcher names it, holding ``lease`` (or another token)."""
    ref = JobRef.of(lease).model_dump()
    if token is not None:
        ref["token"] = token
    with get_client(sync_client=True) as client:
        run = client.create_flow_run(
            _placeholder,
            name=f"{lease.instance_id} #{lease.attempt}",
            parameters={"job": ref},
            state=Scheduled(),
        )
        if not state.is_scheduled():
            client.set_flow_run_state(run.id, state, force=True)
    return str(run.id)


def _new_run(engine: Any, instances: list[str], max_attempts: int) -> str:
    run_id = str(uuid.uuid4())
    create_run(
        engine,
        NewRun(
            run_id=run_id,
            name="boot-reaper",
            harness="simulated",
            alias="sim-openai",
            instance_ids=instances,
            spend_cap_micro_usd=1_000_000,
            max_attempts=max_attempts,
        ),
    )
    return run_id


def _rows(engine: Any, run_id: str) -> dict[str, Any]:
    with engine.connect() as conn:
        return {
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


def test_a_booting_attempt_whose_flow_run_died_is_requeued_at_once(
    e2e_env: Callable[..., EmbeddedStack], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVALFLEET_VISIBILITY_TIMEOUT_S", "600")  # the lease is far from expiry
    from evalfleet.settings import get_settings

    get_settings.cache_clear()
    engine = ledger_io.engine()
    names = [f"boot-{uuid.uuid4().hex[:6]}-{x}" for x in ("crashed", "cancelled", "late", "other")]
    crashed, cancelled, late, other = names
    run_id = _new_run(engine, names, max_attempts=3)
    leases = {x.instance_id: x for x in queue.claim(engine, "harness", 4, run_id=run_id)}
    assert set(leases) == set(names)
    flow_runs = {
        crashed: _flow_run(leases[crashed], Crashed(message="process killed before the flow")),
        cancelled: _flow_run(leases[cancelled], Cancelled()),
        late: _flow_run(leases[late], Scheduled()),  # no worker took it yet: not Prefect's word
        # a dead flow run of the same name but another lease (an earlier claim's, another run's)
        other: _flow_run(leases[other], Crashed(), token="0" * 32),
    }

    assert supervise.reap() == (2, 0)
    rows = _rows(engine, run_id)
    for name in (crashed, cancelled):
        assert rows[name].state == "queued" and rows[name].lease_token is None
        assert flow_runs[name] in rows[name].error_detail
    for name in (late, other):
        assert rows[name].state == "booting" and rows[name].lease_token == leases[name].token
    with engine.connect() as conn:
        visible = dict(
            conn.execute(select(Job.instance_id, Job.lease_token).where(Job.run_id == run_id))
            .tuples()
            .all()
        )
        audit = conn.execute(
            select(AuditLog.actor, AuditLog.action, AuditLog.target, AuditLog.new).where(
                AuditLog.target.like(f"instance:{run_id}/%")
            )
        ).all()
    assert visible[crashed] is None and visible[cancelled] is None  # claimable again
    assert sorted((a.actor, a.action, a.target, a.new["state"]) for a in audit) == sorted(
        ("supervisor", "requeue", f"instance:{run_id}/{name}", "queued")
        for name in (crashed, cancelled)
    )
    assert supervise.reap() == (0, 0)  # idempotent: nothing more, no second audit row
    with engine.connect() as conn:
        assert (
            len(conn.execute(select(AuditLog.id).where(AuditLog.target.like(f"%{run_id}%"))).all())
            == 2
        )

    # the second attempts boot under new leases: the first attempts' dead flow runs share
    # nothing with them, so they are left alone
    again = queue.claim(engine, "harness", 2, run_id=run_id)
    assert sorted(x.attempt for x in again) == [2, 2]
    assert supervise.reap() == (0, 0)


def test_past_max_attempts_a_dead_boot_ends_lost(
    e2e_env: Callable[..., EmbeddedStack], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVALFLEET_VISIBILITY_TIMEOUT_S", "600")
    from evalfleet.settings import get_settings

    get_settings.cache_clear()
    engine = ledger_io.engine()
    name = f"boot-{uuid.uuid4().hex[:6]}-last"
    run_id = _new_run(engine, [name], max_attempts=1)
    [lease] = queue.claim(engine, "harness", 1, run_id=run_id)
    _flow_run(lease, Crashed())
    assert supervise.reap() == (0, 1)
    assert _rows(engine, run_id)[name].state == "lost"
    with engine.connect() as conn:
        assert conn.execute(select(Job.id).where(Job.run_id == run_id)).first() is None


def test_a_return_limited_to_booting_leaves_a_started_instance_alone(
    e2e_env: Callable[..., EmbeddedStack],
) -> None:
    """The flow run may start between the reaper's read and its return: the return is refused
    and changes nothing (job and row keep the lease, no audit row)."""
    engine = ledger_io.engine()
    name = f"boot-{uuid.uuid4().hex[:6]}-started"
    run_id = _new_run(engine, [name], max_attempts=3)
    [lease] = queue.claim(engine, "harness", 1, run_id=run_id)
    queue.mark_running(engine, lease, flow_run_id=str(uuid.uuid4()))
    with pytest.raises(StaleLease):
        requeue(
            engine,
            lease,
            "flow run ended",
            only_from=(InstanceState.BOOTING,),
            audit_actor="supervisor",
        )
    row = _rows(engine, run_id)[name]
    assert row.state == "running" and row.lease_token == lease.token
    with engine.connect() as conn:
        assert conn.execute(select(Job.lease_token).where(Job.run_id == run_id)).scalar_one() == (
            lease.token
        )
        assert (
            conn.execute(select(AuditLog.id).where(AuditLog.target.like(f"%{run_id}%"))).first()
            is None
        )
