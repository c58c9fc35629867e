"""The claim's order across returns, on both databases: a job given back to the queue (its
lease expired, or a worker requeued it) takes its place again ahead of the jobs queued behind
it, after any delay it was given; and the claim reads that order from its index instead of
sorting every claimable job (the hot path: `evalfleet bench queue`)."""

from __future__ import annotations

import time

from queue_helpers import make_run
from sqlalchemy import Engine, text

from ledger import queue, reaper
from ledger.queue_sql import PG_CLAIM

VT_S = 0.05


def _claim_one_by_one(engine: Engine, n: int) -> list[str]:
    """n claims of one job each: the order the database picks (a claim of several is sorted
    again before it returns)."""
    return [lease.instance_id for _ in range(n) for lease in queue.claim(engine, "harness", 1)]


def test_a_job_whose_lease_expired_goes_before_the_jobs_queued_behind_it(
    ledger_engine: Engine,
) -> None:
    _, ids = make_run(ledger_engine, 5)
    first = queue.claim(ledger_engine, "harness", 2, visibility_timeout_s=VT_S)
    assert [lease.instance_id for lease in first] == ids[:2]
    time.sleep(3 * VT_S)
    assert sorted(i for _, i in reaper.expire(ledger_engine).requeued) == ids[:2]
    # behind the three never claimed, they would launch last (the run would end on them)
    assert _claim_one_by_one(ledger_engine, 5) == ids


def test_a_run_enqueued_earlier_still_goes_first_and_a_return_keeps_its_run_s_place(
    ledger_engine: Engine,
) -> None:
    _, older = make_run(ledger_engine, 3, prefix="a")
    _, newer = make_run(ledger_engine, 3, prefix="b")
    (lease,) = queue.claim(ledger_engine, "harness", 1)
    assert lease.instance_id == older[0]
    assert reaper.requeue(ledger_engine, lease, "worker lost") == "queued"
    assert _claim_one_by_one(ledger_engine, 6) == older + newer


def test_a_returned_job_waits_out_its_delay_before_it_takes_its_place(
    ledger_engine: Engine,
) -> None:
    _, ids = make_run(ledger_engine, 3)
    (lease,) = queue.claim(ledger_engine, "harness", 1)
    reaper.requeue(ledger_engine, lease, "rate limited", delay_s=0.5)
    assert _claim_one_by_one(ledger_engine, 1) == [ids[1]]  # not visible yet: the next goes
    time.sleep(0.7)
    assert _claim_one_by_one(ledger_engine, 2) == [ids[0], ids[2]]


def test_a_claim_of_several_returns_them_in_the_claim_s_order_across_runs(
    ledger_engine: Engine,
) -> None:
    _, older = make_run(ledger_engine, 2, prefix="a")
    _, newer = make_run(ledger_engine, 2, prefix="b")
    assert [lease.instance_id for lease in queue.claim(ledger_engine, "harness", 4)] == (
        older + newer
    )


def test_the_claim_reads_its_order_from_the_index_without_sorting(ledger_engine: Engine) -> None:
    make_run(ledger_engine, 2000)
    queue.claim(ledger_engine, "harness", 500)  # leased jobs: the partial index skips them
    with ledger_engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.execute(text("ANALYZE jobs"))
            conn.execute(text("ANALYZE runs"))
            picked = PG_CLAIM.text.split("WITH picked AS (", 1)[1].split("FOR UPDATE", 1)[0]
            plan = "\n".join(
                row[0]
                for row in conn.execute(
                    text(f"EXPLAIN {picked}"), {"pool": "harness", "k": 8}
                ).all()
            )
            assert "ix_jobs_claim" in plan, plan
            assert "Sort" not in plan, plan
        else:
            picked = queue_sql_sqlite_select()
            plan = "\n".join(
                str(row[-1])
                for row in conn.execute(
                    text(f"EXPLAIN QUERY PLAN {picked}"),
                    {"pool": "harness", "k": 8, "now": "9999-12-31 00:00:00.000000"},
                ).all()
            )
            assert "ix_jobs_claim" in plan, plan
            assert "TEMP B-TREE" not in plan, plan


def queue_sql_sqlite_select() -> str:
    from ledger.queue_sql import _claimable_jobs

    return _claimable_jobs(":now")
