"""The hot reads and writes of the ledger read an index, on both databases: the planner tick's
reads of one alias's recent calls (every 15 s per alias, over an ``llm_calls`` table of millions
of rows in a long run), its previous decision, an instance's spend at landing, the reaper, and
the lease holder's steps (heartbeat, mark running, land, requeue). The claim has its own guard
(``test_claim_order``).

Each test calls the real function, captures the SQL it sends (a ``before_cursor_execute``
listener: the test follows the code if the code changes) and asserts the database's plan for it
names the index and neither scans the table nor sorts it.

Statistics, chosen per database as production has them: PostgreSQL runs ``ANALYZE`` after the
rows are written (autovacuum keeps statistics on a live ledger), over enough rows, shaped like a
long run, that a scan would cost more than the index; its planner is left free to choose (no
``enable_seqscan = off``: these tests say what it does choose, not what it could). SQLite gets
no ``ANALYZE``: nothing in evalfleet runs it, so a SQLite ledger is planned without statistics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from plan_helpers import analyze, assert_reads_by_index, captured, plan_of
from plan_helpers import engine as engine  # the fixture
from queue_helpers import make_run
from sqlalchemy import Engine, insert

from evalfleet.states import InstanceState
from ledger import charges, pacer_state, pacer_window, queue, reaper
from ledger.models import LlmCall, PlannerDecision

# --- the planner tick's reads of llm_calls ---------------------------------------------------

_CALLS = 30_000
#: the aliases that kept calling throughout; ``IDLE`` called in the first tenth only, then
#: resumed with a few calls at the end
_BUSY = ("busy-a", "busy-b")
_IDLE = "idle"


def _fill_calls(engine: Engine, now: datetime) -> None:
    """A long run's calls: one a second over the last ``_CALLS`` seconds, spread over the busy
    aliases, the idle alias's in its first tenth and its last five seconds."""
    rows: list[dict[str, Any]] = []
    for i in range(_CALLS):
        at = now - timedelta(seconds=_CALLS - i)
        idle = (i < _CALLS // 10 and i % 3 == 0) or i >= _CALLS - 5
        rows.append(
            {
                "id": i + 1,
                "run_id": f"run-{i % 4}",
                "instance_id": f"inst-{i % 1500:05d}",
                "alias": _IDLE if idle else _BUSY[i % 2],
                "harness": "simulated",
                "requested_at": at,
                "sent_at": at + timedelta(seconds=0.2),
                "input_tokens": 1000,
                "cached_input_tokens": 200,
                "output_tokens": 100,
                "latency_s": 2.0,
                "pacer_wait_s": 0.2,
                "status": 429 if i % 20 == 0 else 200,
                "limit_type": "tokens" if i % 20 == 0 else None,
                "cost_micro_usd": 50,
                "retry": i % 40 == 0,
            }
        )
    with engine.begin() as conn:
        conn.execute(insert(LlmCall), rows)
    analyze(engine)


def test_the_tick_s_reads_of_an_alias_s_recent_calls_use_its_time_index(engine: Engine) -> None:
    now = datetime.now(UTC)
    _fill_calls(engine, now)
    alias, minute, quarter = _BUSY[0], now - timedelta(seconds=60), now - timedelta(seconds=900)
    reads: dict[str, Callable[[Any], object]] = {
        "accepted_rates": lambda c: pacer_window.accepted_rates(
            c, alias, minute, now, token_class="input", cached_input_counts=False
        ),
        "drained_rates": lambda c: pacer_window.drained_rates(
            c, alias, now, token_class="combined", cached_input_counts=True
        ),
        "sent_between": lambda c: charges.sent_between(c, alias, minute, now, "input"),
        "sent_between unplaced": lambda c: charges.sent_between(
            c, alias, minute, now, "input", unplaced_retries=True
        ),
        "calls_sent_between": lambda c: charges.calls_sent_between(c, alias, quarter, now, "input"),
        "longest_recent_wait": lambda c: charges.longest_recent_wait(c, alias, quarter, now),
    }
    for name, read in reads.items():

        def call(read: Callable[[Any], object] = read) -> None:
            with engine.connect() as conn:
                read(conn)

        statements = captured(engine, call, "llm_calls")
        assert len(statements) == 1, name
        assert_reads_by_index(
            engine, statements, "llm_calls", "ix_llm_calls_alias_requested_at", sorts=False
        )


def test_the_tick_s_window_reads_an_alias_s_calls_after_its_watermark_by_index(
    engine: Engine,
) -> None:
    """``read_window`` after the previous tick's watermark (15 s of calls ago): the calls after
    it, not every call the alias made. SQLite reads it from ``ix_llm_calls_alias_id`` (on the
    alias alone it would read them all); PostgreSQL from that or from the primary key past the
    watermark (every alias's calls of the window: as few), never by the alias alone."""
    now = datetime.now(UTC)
    _fill_calls(engine, now)
    watermark = _CALLS - 15  # one call a second

    def call() -> None:
        with engine.connect() as conn:
            window = pacer_window.read_window(
                conn, _BUSY[0], watermark, token_class="input", cached_input_counts=False
            )
        assert window.calls == 5  # every other of the ten before the idle alias's last five

    statements = captured(engine, call, "llm_calls")
    assert len(statements) == 2  # the aggregates, and the errors by kind
    # the errors' GROUP BY sorts what the index range returned (a window's errors), no more
    assert_reads_by_index(
        engine,
        statements,
        "llm_calls",
        "ix_llm_calls_alias_id",
        sorts=True,
        pg_also="pk_llm_calls",
    )
    for statement, parameters in statements:  # the range starts at the watermark
        plan = plan_of(engine, statement, parameters)
        if engine.dialect.name == "postgresql":
            assert "Index Cond: (id > " in plan or "AND (id > " in plan, plan
        else:
            assert "ix_llm_calls_alias_id (alias=? AND id>?)" in plan, plan


def test_the_newest_call_id_is_read_from_the_primary_key(engine: Engine) -> None:
    _fill_calls(engine, datetime.now(UTC))

    def call() -> None:
        with engine.connect() as conn:
            assert pacer_window.latest_call_id(conn) == _CALLS

    ((statement, parameters),) = captured(engine, call, "llm_calls")
    plan = plan_of(engine, statement, parameters)
    if engine.dialect.name == "postgresql":
        assert "Index Only Scan Backward using pk_llm_calls on llm_calls" in plan, plan
        assert "Seq Scan" not in plan, plan
    else:
        # SQLite reads max(rowid) from the table's own b-tree: a SEARCH, not a SCAN
        assert plan.strip() == "SEARCH llm_calls", plan


def test_an_instance_s_spend_at_landing_is_read_by_its_run_and_instance(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``tasks.instance.spent_micro_usd``, read at each landing: the instance's calls, not its
    run's (a long run's are millions)."""
    from tasks import instance

    _fill_calls(engine, datetime.now(UTC))
    monkeypatch.setattr(instance, "engine", lambda: engine)
    statements = captured(
        engine, lambda: instance.spent_micro_usd("run-1", "inst-00001"), "llm_calls"
    )
    assert_reads_by_index(
        engine, statements, "llm_calls", "ix_llm_calls_run_id_instance_id", sorts=False
    )


def test_the_tick_reads_an_alias_s_previous_decision_by_index(engine: Engine) -> None:
    """The newest decision of an alias, where every alias decides each tick: read in id order
    from an index, not by sorting all the alias's decisions (SQLite without
    ``ix_planner_decisions_alias_id``). PostgreSQL may walk the primary key back instead: the
    alias's newest row is among the last tick's, a row per alias back."""
    now = datetime.now(UTC)
    rows = [
        {
            "alias": (_IDLE, *_BUSY)[i % 3],
            "tick_at": now - timedelta(seconds=15 * (6000 - i)),
            "live": 1,
            "booting": 0,
            "queued": 0,
            "ceiling": 1,
            "launches_allowed": 1,
            "binding": "budget",
            "projections": {},
            "budgets": {},
        }
        for i in range(6000)
    ]
    with engine.begin() as conn:
        conn.execute(insert(PlannerDecision), rows)
    analyze(engine)

    def call() -> None:
        with engine.connect() as conn:
            previous = pacer_state.previous_decision(conn, _IDLE)
        assert previous is not None

    statements = captured(engine, call, "planner_decisions")
    assert_reads_by_index(
        engine,
        statements,
        "planner_decisions",
        "ix_planner_decisions_alias_id",
        sorts=False,
        pg_also="pk_planner_decisions",
    )


# --- the queue: reaper and lease holders -----------------------------------------------------


def test_the_reaper_reads_the_expired_leases_from_their_index(engine: Engine) -> None:
    """The reaper (``reaper.expire``, judged by the database's clock) reads the expired leases
    in its order from ``ix_jobs_lease_deadline``: not the whole queue, and no sort."""
    make_run(engine, 3000)
    expired = queue.claim(engine, "harness", 200, visibility_timeout_s=0.05)
    queue.claim(engine, "harness", 600)  # live leases: the index holds them, the reap skips them
    time.sleep(0.2)
    analyze(engine)

    def call() -> None:
        report = reaper.expire(engine, limit=50)
        assert [i for _, i in report.requeued] == [lease.instance_id for lease in expired[:50]]

    statements = captured(engine, call, "jobs")
    selects = [(s, p) for s, p in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(selects) == 1
    assert_reads_by_index(engine, selects, "jobs", "ix_jobs_lease_deadline", sorts=False)


#: the key each step reads the queue's tables by (SQLite names a UNIQUE constraint's index itself)
_KEYS = {
    ("postgresql", "jobs"): "Index Scan using pk_jobs on jobs",
    ("sqlite", "jobs"): "SEARCH jobs USING INTEGER PRIMARY KEY (rowid=?)",
    (
        "postgresql",
        "instance_results",
    ): "uq_instance_results_run_id_instance_id on instance_results",
    ("sqlite", "instance_results"): (
        "SEARCH instance_results USING INDEX sqlite_autoindex_instance_results_1 "
        "(run_id=? AND instance_id=?)"
    ),
}


@pytest.mark.parametrize("step", ["heartbeat", "mark_running", "land", "requeue"])
def test_a_lease_holder_s_step_finds_its_job_and_instance_by_key(engine: Engine, step: str) -> None:
    """Heartbeat, mark running, land and requeue touch the one job (primary key) and the one
    instance row (``run_id, instance_id``) of the lease, however long the queue."""
    make_run(engine, 3000)
    first, second = queue.claim(engine, "harness", 2)
    queue.claim(engine, "harness", 500)
    queue.mark_running(engine, second)
    analyze(engine)
    steps: dict[str, Callable[[], object]] = {
        "heartbeat": lambda: queue.heartbeat(engine, first),
        "mark_running": lambda: queue.mark_running(engine, first),
        "land": lambda: queue.land(engine, second, queue.Outcome(state=InstanceState.ERROR)),
        "requeue": lambda: reaper.requeue(engine, first, "worker lost"),
    }
    dialect = engine.dialect.name
    tables = ("jobs", "instance_results")
    seen = set()
    # every statement of the step, per table it names (PostgreSQL's are one CTE each)
    for statement, parameters in captured(engine, steps[step], *tables):
        named = statement.replace(",", " ").split()
        for table in (t for t in tables if t in named):
            seen.add(table)
            plan = plan_of(engine, statement, parameters)
            shown = f"{' '.join(statement.split())}\n{plan}"
            assert _KEYS[(dialect, table)] in plan, shown
            scan = f"Seq Scan on {table}" if dialect == "postgresql" else f"SCAN {table}"
            assert scan not in plan, shown
    assert seen == set(tables)
