"""A run's launch order in the ledger, on both databases: the instances' sizes from earlier
runs of the harness (``ledger.forecasts``), the rank each job is enqueued with, and a claim
that follows it."""

from __future__ import annotations

import uuid

from queue_helpers import make_run
from sqlalchemy import Engine, select, update

from evalfleet.states import RunState
from ledger import queue
from ledger.forecasts import instance_sizes
from ledger.models import InstanceResult, Job
from ledger.runs import NewRun, create_run, enqueue
from planner.launch_order import launch_ranks


def _landed(engine: Engine, run_id: str, calls: dict[str, int], state: str = "resolved") -> None:
    with engine.begin() as conn:
        for instance_id, n in calls.items():
            conn.execute(
                update(InstanceResult)
                .where(InstanceResult.run_id == run_id, InstanceResult.instance_id == instance_id)
                .values(state=state, calls=n)
            )


def _pending_run(engine: Engine, harness: str, instances: list[str]) -> str:
    run_id = str(uuid.uuid4())
    create_run(
        engine,
        NewRun(
            run_id=run_id,
            name="next",
            harness=harness,
            alias="sim",
            instance_ids=instances,
            spend_cap_micro_usd=1_000_000,
            state=RunState.RUNNING,
        ),
        enqueue_now=False,
    )
    return run_id


def test_sizes_are_the_median_calls_of_earlier_runs_of_the_same_harness(
    ledger_engine: Engine,
) -> None:
    first, ids = make_run(ledger_engine, 4, prefix="i")
    second, _ = make_run(ledger_engine, 4, prefix="i")
    third, _ = make_run(ledger_engine, 4, prefix="i")
    _landed(ledger_engine, first, {ids[0]: 10, ids[1]: 50, ids[2]: 7})
    _landed(ledger_engine, second, {ids[0]: 30, ids[1]: 70})
    _landed(ledger_engine, third, {ids[0]: 20}, state="error")  # a timeout: it made 20 calls
    _landed(ledger_engine, third, {ids[1]: 900}, state="aborted")  # stopped from outside
    _landed(ledger_engine, third, {ids[2]: 0}, state="unresolved")  # no calls: no measure
    other = _pending_run(ledger_engine, "another-harness", ids)
    _landed(ledger_engine, other, {ids[3]: 500})
    new = _pending_run(ledger_engine, "simulated", ids)
    _landed(ledger_engine, new, {ids[3]: 400})  # the run's own rows never count
    with ledger_engine.connect() as conn:
        sizes = instance_sizes(conn, "simulated", ids, excluding_run=new)
        assert sizes == {ids[0]: 20.0, ids[1]: 60.0, ids[2]: 7.0}
        assert instance_sizes(conn, "unknown-harness", ids, excluding_run=new) == {}


def test_jobs_are_claimed_in_the_ranks_they_were_enqueued_with(ledger_engine: Engine) -> None:
    ids = [f"j-{k}" for k in range(6)]
    run_id = _pending_run(ledger_engine, "simulated", ids)
    sizes = {"j-0": 5.0, "j-1": 90.0, "j-2": 40.0, "j-3": 1.0, "j-4": 60.0, "j-5": 20.0}
    ranks = launch_ranks(ids, sizes)
    with ledger_engine.begin() as conn:
        enqueue(conn, run_id, ids, ranks=ranks)
    with ledger_engine.connect() as conn:
        stored = dict(conn.execute(select(Job.instance_id, Job.launch_rank)).tuples().all())
    assert stored == ranks
    claimed = [lease.instance_id for lease in queue.claim(ledger_engine, "harness", 4)]
    claimed += [
        lease.instance_id for lease in queue.claim(ledger_engine, "harness", 4, run_id=run_id)
    ]
    assert claimed == ["j-1", "j-2", "j-4", "j-5", "j-0", "j-3"]


def test_without_ranks_jobs_go_in_the_order_given(ledger_engine: Engine) -> None:
    ids = [f"k-{k}" for k in (5, 1, 4, 2, 3)]  # not sorted: the claim must not sort by id
    run_id = _pending_run(ledger_engine, "simulated", ids)
    with ledger_engine.begin() as conn:
        enqueue(conn, run_id, ids)
    assert [lease.instance_id for lease in queue.claim(ledger_engine, "harness", 10)] == ids
