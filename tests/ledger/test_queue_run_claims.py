"""Run-scoped claims (``claim(..., run_id=...)``) on both databases: the dispatcher claims each
run's own share, so a claim for one run must take only that run's jobs, oldest first, and still
honour pauses and run states."""

from __future__ import annotations

import pytest
from queue_helpers import make_run, states
from sqlalchemy import Engine

from evalfleet.errors import ConfigError
from ledger import queue
from ledger.pauses import set_pause


def test_a_run_scoped_claim_takes_only_that_runs_jobs_in_order(ledger_engine: Engine) -> None:
    run_a, inst_a = make_run(ledger_engine, 4, prefix="a")
    run_b, inst_b = make_run(ledger_engine, 4, prefix="b")
    # run b's jobs were enqueued later: a FIFO claim would take run a's first
    got = queue.claim(ledger_engine, "harness", 3, run_id=run_b)
    assert [lease.instance_id for lease in got] == inst_b[:3]
    assert {lease.run_id for lease in got} == {run_b}
    assert states(ledger_engine, run_a) == {i: "queued" for i in inst_a}
    assert sorted(states(ledger_engine, run_b).values()) == ["booting"] * 3 + ["queued"]
    # asking for more than is left gives what is left of that run only
    rest = queue.claim(ledger_engine, "harness", 10, run_id=run_b)
    assert [lease.instance_id for lease in rest] == inst_b[3:]
    assert queue.claim(ledger_engine, "harness", 10, run_id=run_b) == []
    # the unscoped claim still works and finds run a's jobs
    assert [x.instance_id for x in queue.claim(ledger_engine, "harness", 10)] == inst_a


def test_a_run_scoped_claim_honours_pauses(ledger_engine: Engine) -> None:
    run_a, _ = make_run(ledger_engine, 2, prefix="a")
    run_b, _ = make_run(ledger_engine, 2, prefix="b")
    set_pause(ledger_engine, "run", run_a, True, actor="op", reason="spend cap")
    assert queue.claim(ledger_engine, "harness", 5, run_id=run_a) == []
    set_pause(ledger_engine, "pool", "harness", True, actor="op", reason="maintenance")
    assert queue.claim(ledger_engine, "harness", 5, run_id=run_b) == []
    set_pause(ledger_engine, "pool", "harness", False, actor="op", reason="done")
    assert len(queue.claim(ledger_engine, "harness", 5, run_id=run_b)) == 2
    assert queue.claim(ledger_engine, "harness", 5, run_id="no-such-run") == []


def test_a_bad_run_id_is_refused_naming_the_field(ledger_engine: Engine) -> None:
    with pytest.raises(ConfigError, match="run_id"):
        queue.claim(ledger_engine, "harness", 1, run_id="")
    with pytest.raises(ConfigError, match="run_id"):
        queue.claim(ledger_engine, "harness", 1, run_id="x" * 37)
