"""What the query-plan tests share (``test_hot_query_plans``, ``test_tick_query_plans``): the
ledger emptied of the rows they fill, the statements a real function sends (captured with a
``before_cursor_execute`` listener, so a test follows the code), the database's plan of one,
and the assertion that a plan reads a table through an index, neither scanning nor sorting it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine, event, text

__all__ = ["analyze", "assert_reads_by_index", "captured", "engine", "plan_of"]

#: tables these tests fill that the ledger fixture does not empty between PostgreSQL tests
_OWN_TABLES = ("llm_calls", "planner_decisions")


@pytest.fixture
def engine(ledger_engine: Engine) -> Iterator[Engine]:
    """The ledger, with no calls or decisions left by an earlier test."""
    if ledger_engine.dialect.name == "postgresql":
        with ledger_engine.begin() as conn:
            conn.execute(text(f"TRUNCATE {', '.join(_OWN_TABLES)} RESTART IDENTITY"))
    yield ledger_engine


def captured(engine: Engine, call: Callable[[], object], *tables: str) -> list[tuple[str, Any]]:
    """The statements ``call`` sent that read or write any of ``tables``, with their
    parameters."""
    sent: list[tuple[str, Any]] = []

    def grab(conn, cursor, statement, parameters, context, executemany):  # type: ignore[no-untyped-def]
        words = statement.replace(",", " ").split()
        if (
            not executemany
            and words
            and words[0].upper() in {"SELECT", "UPDATE", "DELETE", "WITH"}
            and any(table in words for table in tables)
        ):
            sent.append((statement, parameters))

    event.listen(engine, "before_cursor_execute", grab)
    try:
        call()
    finally:
        event.remove(engine, "before_cursor_execute", grab)
    assert sent, f"the call sent no statement on {tables}"
    return sent


def plan_of(engine: Engine, statement: str, parameters: Any) -> str:
    """The database's plan of one captured statement (EXPLAIN runs nothing)."""
    sqlite = engine.dialect.name == "sqlite"
    with engine.connect() as conn:
        rows = conn.exec_driver_sql(
            ("EXPLAIN QUERY PLAN " if sqlite else "EXPLAIN ") + statement, parameters
        ).all()
    return "\n".join(str(row[-1]) for row in rows)


def analyze(engine: Engine) -> None:
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text("ANALYZE"))


def assert_reads_by_index(
    engine: Engine,
    statements: list[tuple[str, Any]],
    table: str,
    index: str,
    *,
    sorts: bool,
    pg_also: str | None = None,
) -> None:
    """Each statement's plan reads ``table`` through ``index`` (on PostgreSQL, or ``pg_also``),
    scans no table of it whole, and (unless ``sorts``: a GROUP BY of the rows read) sorts
    nothing."""
    for statement, parameters in statements:
        plan = plan_of(engine, statement, parameters)
        shown = f"{' '.join(statement.split())}\n{plan}"
        if engine.dialect.name == "postgresql":
            assert any(
                f"{name} on {table}" in plan or f"Bitmap Index Scan on {name}" in plan
                for name in (index, pg_also or index)
            ), shown
            assert f"Seq Scan on {table}" not in plan, shown
            if not sorts:
                assert "Sort" not in plan, shown
        else:
            assert f"SEARCH {table} USING INDEX {index} (" in plan or (
                f"SEARCH {table} USING COVERING INDEX {index} (" in plan
            ), shown
            assert f"SCAN {table}" not in plan, shown
            assert "TEMP B-TREE FOR ORDER BY" not in plan, shown
