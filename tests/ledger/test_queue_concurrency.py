"""Concurrent claimers (8 threads; 4 processes) on one queue never get the same job twice, and
together they get every job — on SQLite and PostgreSQL.

The workers start together at a barrier and each holds its first lease until all have one
(see ``queue_helpers.claim_until_empty``), so they overlap however loaded the machine is."""

from __future__ import annotations

import multiprocessing
import threading
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

import pytest
from queue_helpers import claim_until_empty, jobs, make_run, set_process_barrier, states
from sqlalchemy import Engine


def _check(engine: Engine, run_id: str, instances: list[str], per_worker: list[list]) -> None:  # type: ignore[type-arg]
    claimed = [item for worker in per_worker for item in worker]
    job_ids = [job_id for job_id, _, _ in claimed]
    assert len(job_ids) == len(set(job_ids)), "a job was claimed twice"
    assert sorted(i for _, i, _ in claimed) == sorted(instances), "a job was lost or duplicated"
    assert len({token for _, _, token in claimed}) == len(claimed)
    assert all(per_worker), "a worker got no job although each claimed while jobs were queued"
    assert set(states(engine, run_id).values()) == {"booting"}
    # every job row carries the token of the one lease that got it, claimed once
    rows = jobs(engine, run_id)
    assert {i: (t, 1) for _, i, t in claimed} == rows


@pytest.mark.parametrize("k", [1, 3])
def test_eight_threads_never_share_a_job(ledger_engine: Engine, ledger_url: str, k: int) -> None:
    run_id, instances = make_run(ledger_engine, 160)
    barrier = threading.Barrier(8)
    with ThreadPoolExecutor(max_workers=8) as pool:
        futures = [pool.submit(claim_until_empty, ledger_url, k, barrier) for _ in range(8)]
        per_worker = [f.result(timeout=60) for f in futures]
    _check(ledger_engine, run_id, instances, per_worker)


def test_four_processes_never_share_a_job(ledger_engine: Engine, ledger_url: str) -> None:
    run_id, instances = make_run(ledger_engine, 160)
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(4)
    with ProcessPoolExecutor(
        max_workers=4, mp_context=context, initializer=set_process_barrier, initargs=(barrier,)
    ) as pool:
        futures = [pool.submit(claim_until_empty, ledger_url, 1) for _ in range(4)]
        per_worker = [f.result(timeout=60) for f in futures]
    _check(ledger_engine, run_id, instances, per_worker)
