"""The reads of each planner tick, each dispatch pass and each gateway call find their rows by
index, on both databases, over a ledger shaped like a long run: thousands of instances in
several runs, most of them finished, a planner decision per alias per tick, a gateway key per
run. Companion of ``test_hot_query_plans.py`` (its helpers and its ``engine`` fixture: the same
capture of the SQL the real function sends, the same statistics per database).

Guarded here:

* the live tasks (``instance_results`` in a calling state) that ``tasks.plan.read_fleet`` and
  ``tasks.dispatch.run_loads`` read: ``ix_instance_results_state``, not the finished instances;
* the newest decision of each alias (``tasks.dispatch.planner_ceilings``): one index entry per
  alias, not every decision the aliases ever had;
* the spend reservation (``gateway.spend.reserve``) and its refusal read: the key's unique hash.

Read and left unguarded, as the tables are small or the read is all of them: ``runs`` (a row per
run; ``run_loads`` reads every live one), ``pause_flags`` and ``alias_controls`` (a row per
pool, paused run or alias), and the queued count per run over ``jobs``: ``jobs`` holds only
unfinished work (a job is deleted when its instance lands), and the queued jobs the count reads
are most of it (the leased ones are at most the live tasks), so PostgreSQL's scan of it reads
little more than an index would.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from plan_helpers import analyze, assert_reads_by_index, captured, plan_of
from plan_helpers import engine as engine  # the fixture
from queue_helpers import make_run
from sqlalchemy import Engine, delete, event, insert, select, text, update

from evalfleet.errors import SpendCapExceeded
from gateway.keys import KIND_GATEWAY, STATE_ACTIVE
from gateway.spend import reserve
from ledger import queue
from ledger.models import ApiKey, InstanceResult, Job, PlannerDecision

# --- the live tasks ----------------------------------------------------------------------------

_RUNS = 4
_INSTANCES = 2000
_LANDED = 1800  # of each finished-looking run's instances
_CLAIMED = 60  # per run: leased, booting


def _fill_runs(engine: Engine) -> list[str]:
    """Four runs of ``_INSTANCES``: each has ``_CLAIMED`` booting tasks; in the first three
    ``_LANDED`` more have landed (resolved, their jobs deleted, as a landing does), the last is
    still all queued."""
    runs = [make_run(engine, _INSTANCES, prefix=f"r{r}")[0] for r in range(_RUNS)]
    for run_id in runs:
        queue.claim(engine, "harness", _CLAIMED, run_id=run_id)
    with engine.begin() as conn:
        for run_id in runs[:-1]:
            landed = (
                select(Job.instance_id)
                .where(Job.run_id == run_id, Job.lease_token.is_(None))
                .order_by(Job.id)
                .limit(_LANDED)
            )
            ids = list(conn.execute(landed).scalars())
            conn.execute(
                update(InstanceResult)
                .where(InstanceResult.run_id == run_id, InstanceResult.instance_id.in_(ids))
                .values(state="resolved")
            )
            conn.execute(delete(Job).where(Job.run_id == run_id, Job.instance_id.in_(ids)))
    analyze(engine)
    return runs


def test_the_tick_and_the_dispatcher_read_the_live_tasks_by_their_state_index(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tick's task ages and the dispatcher's live counts read the booting and running
    instances from ``ix_instance_results_state``, not every instance of the runs (most have
    finished). The dispatcher's GROUP BY run sorts (SQLite) or hashes what that returned."""
    from tasks import dispatch, plan

    monkeypatch.setattr(dispatch, "engine", lambda: engine)
    monkeypatch.setattr(plan, "engine", lambda: engine)
    runs = _fill_runs(engine)

    def tick() -> None:
        (fleet,) = plan.read_fleet(datetime.now(UTC), prefect_paused=False)
        assert fleet.booting == _RUNS * _CLAIMED

    def dispatch_pass() -> None:
        loads = {load.run_id: load.live for load in dispatch.run_loads()}
        assert loads == dict.fromkeys(runs, _CLAIMED)

    for call in (tick, dispatch_pass):
        statements = captured(engine, call, "instance_results")
        assert len(statements) == 1, call.__name__
        assert_reads_by_index(
            engine, statements, "instance_results", "ix_instance_results_state", sorts=True
        )


# --- the planner's ceilings, per dispatch pass -------------------------------------------------

_ALIASES = ("sim", "busy", "quiet")
_TICKS = 2000  # per alias: a little over eight hours of ticks


def test_the_dispatcher_reads_each_alias_s_newest_decision_not_its_history(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``planner_ceilings`` reads one decision per alias, its newest, whatever the number of
    ticks behind it. PostgreSQL: each alias's max(id) is a one-row index read (a ``Limit`` on
    ``ix_planner_decisions_alias_id`` or backwards on the primary key), with no scan or
    aggregate over the table. SQLite (whose plan reads the same for one index entry or the whole
    alias's range): the statement runs in fewer VM steps than one alias has decisions, so it
    cannot have read them."""
    from tasks import dispatch

    now = datetime.now(UTC)
    rows = [
        {
            "alias": _ALIASES[i % len(_ALIASES)],
            "tick_at": now - timedelta(seconds=15 * (_TICKS - i // len(_ALIASES))),
            "live": 1,
            "booting": 0,
            "queued": 0,
            "ceiling": i,
            "launches_allowed": 1,
            "binding": "budget",
            "projections": {},
            "budgets": {},
        }
        for i in range(_TICKS * len(_ALIASES))
    ]
    with engine.begin() as conn:
        conn.execute(insert(PlannerDecision), rows)
    analyze(engine)
    monkeypatch.setattr(dispatch, "engine", lambda: engine)
    newest = {alias: len(rows) - len(_ALIASES) + i for i, alias in enumerate(_ALIASES)}
    asked = {"sim", "quiet", "undecided"}
    steps = [0]
    handled: list[Any] = []  # the DBAPI connections given a progress handler

    def count_steps(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        if "planner_decisions" in statement:

            def step() -> int:
                steps[0] += 1
                return 0

            handled.append(conn.connection.driver_connection)
            handled[-1].set_progress_handler(step, 1)

    def call() -> None:
        sqlite = engine.dialect.name == "sqlite"
        if sqlite:
            event.listen(engine, "before_cursor_execute", count_steps)
        try:
            ceilings = dispatch.planner_ceilings(asked)
        finally:
            if sqlite:
                event.remove(engine, "before_cursor_execute", count_steps)
                for driver in handled:
                    driver.set_progress_handler(None, 1)
        assert ceilings == {a: newest[a] for a in asked & set(newest)}

    statements = captured(engine, call, "planner_decisions")
    assert len(statements) == 1
    ((statement, parameters),) = statements
    plan = plan_of(engine, statement, parameters)
    shown = f"{' '.join(statement.split())}\n{plan}"
    if engine.dialect.name == "postgresql":
        assert "Seq Scan on planner_decisions" not in plan, shown
        assert "HashAggregate" not in plan and "GroupAggregate" not in plan, shown
        assert "Bitmap" not in plan, shown
        for read in (line for line in plan.splitlines() if "Index" in line and " Scan" in line):
            # each alias's max: one entry of its index range, or the primary key walked back
            # to its newest row under a Limit; the outer read: the newest ids on the key
            assert any(
                name in read
                for name in (
                    "Index Only Scan Backward using ix_planner_decisions_alias_id",
                    "Index Only Scan using ix_planner_decisions_alias_id",  # an empty range
                    "Index Scan Backward using pk_planner_decisions",
                    "Index Scan using pk_planner_decisions on planner_decisions  ",
                )
            ), shown
        assert plan.count("Limit") + plan.count("ix_planner_decisions_alias_id") >= len(asked)
    else:
        assert "SCAN planner_decisions" not in plan, shown
        assert 0 < steps[0] < _TICKS, f"{steps[0]} VM steps\n{shown}"


# --- the gateway's spend reservation, per call ---------------------------------------------------

_KEYS = 3000  # a gateway key per run, over months of runs


def test_the_spend_reservation_finds_its_key_by_its_unique_hash(engine: Engine) -> None:
    """Each call's reservation (one conditional UPDATE) and, when refused, the read saying why
    find the key by its unique ``key_hash`` index, among every run's keys ever issued."""
    run_id, _ = make_run(engine, 1)
    far = datetime.now(UTC) + timedelta(days=30)
    rows: list[dict[str, Any]] = [
        {
            "id": str(uuid.uuid4()),
            "run_id": run_id if i == 0 else None,
            "kind": KIND_GATEWAY,
            "key_hash": f"hash-{i:06d}",
            "spend_cap_micro_usd": 1_000,
            "spent_micro_usd": 0,
            "reserved_micro_usd": 0,
            "state": STATE_ACTIVE if i % 10 == 0 else "revoked",
            "expires_at": far,
        }
        for i in range(_KEYS)
    ]
    with engine.begin() as conn:
        conn.execute(insert(ApiKey), rows)
    analyze(engine)
    now = datetime.now(UTC)

    def granted() -> None:
        assert reserve(engine, "hash-000000", 600, now).run_id == run_id

    def refused() -> None:
        with pytest.raises(SpendCapExceeded):
            reserve(engine, "hash-000000", 600, now)  # 1200 > the cap

    index = (
        "uq_api_keys_key_hash"
        if engine.dialect.name == "postgresql"
        else "sqlite_autoindex_api_keys_2"  # the id primary key is _1
    )
    statements = captured(engine, granted, "api_keys")
    assert [s.split()[0] for s, _ in statements] == ["UPDATE"]
    statements = captured(engine, refused, "api_keys")
    assert [s.split()[0] for s, _ in statements] == ["UPDATE", "SELECT"]
    assert_reads_by_index(engine, statements, "api_keys", index, sorts=False)


@pytest.fixture(autouse=True)
def _no_keys_left(ledger_engine: Engine) -> Iterator[None]:
    """The keys of an earlier PostgreSQL test are gone (``runs`` is truncated with CASCADE, which
    leaves the run-less ones)."""
    if ledger_engine.dialect.name == "postgresql":
        with ledger_engine.begin() as conn:
            conn.execute(text("TRUNCATE api_keys"))
    yield
