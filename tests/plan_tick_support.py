"""The PostgreSQL ledger of the planner tick's tests and the rows they set up in it: a fresh
migrated database per test module (``plan_db``), emptied for each test (``plan_ledger``), runs with
their tasks and jobs, gateway calls, the provider's stated limits, and the stored controller state.
Import the helpers with ``from tests.plan_tick_support import ...``; a test module takes the
fixtures as ``plan_db = plan_tick_support.plan_db`` (and ``plan_ledger``), so its tests' arguments
do not shadow an import."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, insert

from evalfleet.settings import get_settings
from ledger import pacer_state
from ledger.db import make_engine
from ledger.models import SERVED_STATUSES, AliasObservation, InstanceResult, Job, LlmCall, Run
from planner.curves import DEFAULT_HARNESS
from tasks import ledger_io
from tests.pg_support import sibling_database

ALIAS = "sim-openai"  # embedded default: 9 calls/s, 27k tokens/s, cooldown 30 s
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


_TABLES = (
    "jobs",
    "instance_results",
    "llm_calls",
    "planner_decisions",
    "pacer_states",
    "pacer_config_history",
    "pacer_configs",
    "pause_flags",
    "alias_observations",
    "alias_controls",
    "runs",
)


@pytest.fixture(scope="module")
def plan_db(pg_database: str) -> Iterator[str]:
    """One fresh migrated PostgreSQL ledger for this module."""
    with sibling_database(pg_database, "plan") as url:
        yield url


@pytest.fixture
def plan_ledger(plan_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    """The module's ledger, emptied (the append-only audit log aside), as ``tasks.ledger_io``'s."""
    eng = make_engine(plan_db)
    with eng.begin() as conn:
        conn.exec_driver_sql(f"TRUNCATE {', '.join(_TABLES)} RESTART IDENTITY CASCADE")
    monkeypatch.setenv("EVALFLEET_DATABASE_URL", plan_db)
    monkeypatch.delenv("EVALFLEET_ALIASES_FILE", raising=False)
    get_settings.cache_clear()
    ledger_io.engine.cache_clear()
    ledger_io.sessions.cache_clear()
    yield eng
    eng.dispose()
    ledger_io.engine().dispose()
    ledger_io.engine.cache_clear()
    ledger_io.sessions.cache_clear()
    get_settings.cache_clear()


def add_run(
    eng: Engine,
    *,
    running: int = 0,
    booting: int = 0,
    queued: int = 0,
    task_cap: int | None = None,
    alias: str = ALIAS,
    now: datetime = T0,
    instance_timeout_s: float | None = None,
) -> str:
    """A running run with ``running`` tasks (ages 30 s apart), ``booting`` ones, queued jobs."""
    run_id = str(uuid.uuid4())
    with eng.begin() as conn:
        conn.execute(
            insert(Run).values(
                id=run_id,
                name="plan-test",
                harness=DEFAULT_HARNESS,  # sized on the shipped curve of the real traces
                alias=alias,
                state="running",
                task_cap=task_cap,
                instance_timeout_s=instance_timeout_s,
                spend_cap_micro_usd=10**9,
                max_attempts=3,
                config={},
            )
        )
        rows: list[tuple[str, datetime | None]] = []
        for k in range(running):
            rows.append(("running", now - timedelta(seconds=30 * k)))
        rows += [("booting", None)] * booting
        rows += [("queued", None)] * queued
        for i, (state, started) in enumerate(rows):
            conn.execute(
                insert(InstanceResult).values(
                    run_id=run_id,
                    instance_id=f"i{i}",
                    state=state,
                    started_at=started,
                    lease_token=None if state == "queued" else "lease",
                )
            )
            conn.execute(
                insert(Job).values(
                    run_id=run_id,
                    instance_id=f"i{i}",
                    visible_at=now,
                    lease_token=None if state == "queued" else "lease",
                )
            )
    return run_id


def add_calls(
    eng: Engine,
    n: int,
    *,
    status: int = 200,
    limit_type: str | None = None,
    run_id: str | None = None,
    at: datetime = T0,
    tokens: int = 1000,
    pacer_wait_s: float = 0.0,
    retry: bool = False,
    cached: int = 0,
    latency_s: float = 1.0,
    sent_at: datetime | None = None,
) -> None:
    """``n`` calls of ``tokens`` input tokens (``cached`` of them cache reads) each, requested
    ``at`` and sent upstream ``sent_at`` (None: unrecorded, as on rows before it was)."""
    with eng.begin() as conn:
        conn.execute(
            insert(LlmCall),
            [
                {
                    "run_id": run_id,
                    "alias": ALIAS,
                    "requested_at": at,
                    "sent_at": sent_at,
                    "input_tokens": tokens if status in SERVED_STATUSES else 0,
                    "cached_input_tokens": cached if status in SERVED_STATUSES else 0,
                    "output_tokens": 100 if status in SERVED_STATUSES else 0,
                    "status": status,
                    "limit_type": limit_type,
                    "latency_s": latency_s,
                    "pacer_wait_s": pacer_wait_s,
                    "retry": retry,
                }
                for _ in range(n)
            ],
        )


def add_stated_limits(eng: Engine, limits: dict[str, float], at: datetime | None = None) -> None:
    """A response whose rate-limit headers stated ``limits`` (per minute), 5 s before T0."""
    with eng.begin() as conn:
        conn.execute(
            insert(AliasObservation).values(
                alias=ALIAS,
                observed_at=at or T0 - timedelta(seconds=5),
                status=200,
                headers={},
                limits={"limits": limits, "remaining": {}},
            )
        )


def stored(eng: Engine) -> pacer_state.StoredState:
    with eng.connect() as conn:
        s = pacer_state.load_state(conn, ALIAS)
    assert s is not None
    return s
