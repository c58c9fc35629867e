"""Helpers shared by the queue tests (imported as a plain module: tests/ledger is on sys.path)."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Engine, select

from ledger.models import InstanceResult, Job
from ledger.runs import NewRun, create_run


def make_run(
    engine: Engine, n: int, *, max_attempts: int = 3, state: str = "running", prefix: str = "inst"
) -> tuple[str, list[str]]:
    from evalfleet.states import RunState

    run_id = str(uuid.uuid4())
    instances = [f"{prefix}-{i:05d}" for i in range(n)]
    create_run(
        engine,
        NewRun(
            run_id=run_id,
            name="test-run",
            harness="simulated",
            alias="sim",
            instance_ids=instances,
            spend_cap_micro_usd=1_000_000,
            max_attempts=max_attempts,
            state=RunState(state),
        ),
    )
    return run_id, instances


def states(engine: Engine, run_id: str) -> dict[str, str]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(InstanceResult.instance_id, InstanceResult.state).where(
                InstanceResult.run_id == run_id
            )
        ).all()
    return {i: s for i, s in rows}


def jobs(engine: Engine, run_id: str) -> dict[str, tuple[str | None, int]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(Job.instance_id, Job.lease_token, Job.receive_count).where(Job.run_id == run_id)
        ).all()
    return {i: (t, c) for i, t, c in rows}


#: Seconds a worker waits at a barrier for the others (they start within a second or two even
#: on a loaded machine; a worker that died breaks the barrier for the rest).
BARRIER_TIMEOUT_S = 60.0

_process_barrier: Any = None


def set_process_barrier(barrier: Any) -> None:
    """A ``ProcessPoolExecutor`` initializer: the barrier the pool's workers share (a
    ``multiprocessing`` barrier is inherited at fork, it cannot be passed as an argument)."""
    global _process_barrier
    _process_barrier = barrier


def claim_until_empty(url: str, k: int, barrier: Any = None) -> list[tuple[int, str, str]]:
    """A worker: its own engine, claim ``k`` at a time until the queue is empty.

    The workers meet twice at ``barrier`` (``threading.Barrier`` for threads; for processes, the
    one ``set_process_barrier`` installed): once connected, so that start-up is not part of the
    race, and after their first claim, so that every worker holds a lease while the others claim
    (whatever the scheduler does, the claimers overlap). Then they race until the queue is empty.
    Returns (job id, instance id, token) of every lease it got. Used in threads and processes.
    """
    from ledger import queue
    from ledger.db import make_engine

    barrier = barrier if barrier is not None else _process_barrier
    if barrier is None:
        raise RuntimeError("claim_until_empty needs a barrier shared by the workers")
    engine = make_engine(url, pool_size=2)
    got: list[tuple[int, str, str]] = []
    try:
        with engine.connect():
            pass
        barrier.wait(timeout=BARRIER_TIMEOUT_S)
        first = queue.claim(engine, "harness", k)
        got.extend((lease.job_id, lease.instance_id, lease.token) for lease in first)
        barrier.wait(timeout=BARRIER_TIMEOUT_S)
        empty_in_a_row = 0
        while empty_in_a_row < 2:
            leases = queue.claim(engine, "harness", k)
            if not leases:
                empty_in_a_row += 1
                continue
            empty_in_a_row = 0
            got.extend((lease.job_id, lease.instance_id, lease.token) for lease in leases)
    finally:
        engine.dispose()
    return got
