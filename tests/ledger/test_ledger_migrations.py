"""Migrations: a single head; upgrade from empty, no diff against the models, downgrade to empty,
and the audit log is append-only at the database level — on SQLite and on PostgreSQL."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.exc import DatabaseError

from evalfleet.errors import NotFound
from ledger.db import make_engine
from ledger.migrate import current, downgrade, heads, upgrade
from ledger.models import Base


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_url(request: pytest.FixtureRequest, tmp_path) -> str:  # type: ignore[no-untyped-def]
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'sub' / 'ledger.sqlite3'}"
    return str(request.getfixturevalue("fresh_pg_url"))


def test_downgrade_of_a_missing_sqlite_file_is_refused_without_creating_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "nope.sqlite3"
    with pytest.raises(NotFound, match="no SQLite ledger"):
        downgrade(f"sqlite:///{path}")
    assert not path.exists()


def test_single_head() -> None:
    assert len(heads()) == 1


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_matches_models_and_downgrade_removes_everything(empty_url: str) -> None:
    assert current(empty_url) is None
    upgrade(empty_url)
    assert current(empty_url) == heads()[0]
    assert _tables(empty_url) == set(Base.metadata.tables) | {"alembic_version"}

    engine = make_engine(empty_url)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, Base.metadata)
        assert diff == []
    finally:
        engine.dispose()

    upgrade(empty_url)  # idempotent at head
    downgrade(empty_url)
    assert current(empty_url) is None
    assert _tables(empty_url) <= {"alembic_version"}
    # and back up again from empty: the downgrade removed triggers/functions too
    upgrade(empty_url)
    assert current(empty_url) == heads()[0]


@pytest.mark.parametrize(
    "statement", ["UPDATE audit_log SET reason = 'x'", "DELETE FROM audit_log"]
)
def test_audit_log_is_append_only(ledger_url: str, statement: str) -> None:
    engine = make_engine(ledger_url)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO audit_log (actor, action, target, reason) "
                    "VALUES ('tester', 'pause', 'pool:harness', 'because')"
                )
            )
        with pytest.raises(DatabaseError, match="append-only"), engine.begin() as conn:
            conn.execute(text(statement))
        with engine.connect() as conn:
            reasons = conn.execute(text("SELECT reason FROM audit_log")).scalars().all()
        assert "because" in reasons
        assert "x" not in reasons
    finally:
        engine.dispose()


def test_runs_written_before_the_instance_timeout_column_get_their_configs_timeout(
    empty_url: str,
) -> None:
    upgrade(empty_url, "0009")
    engine = make_engine(empty_url)
    insert = text(
        "INSERT INTO runs (id, name, harness, alias, state, spend_cap_micro_usd, priority, "
        "max_attempts, config) VALUES (:id, 'r', 'h', 'a', 'running', 1, 1.0, 3, :config)"
    )
    try:
        with engine.begin() as conn:
            conn.execute(insert, {"id": "set", "config": '{"timeouts": {"instance_s": 1800.0}}'})
            conn.execute(insert, {"id": "absent", "config": '{"name": "old"}'})
        upgrade(empty_url)
        with engine.connect() as conn:
            rows = {
                str(run_id): timeout
                for run_id, timeout in conn.execute(text("SELECT id, instance_timeout_s FROM runs"))
            }
    finally:
        engine.dispose()
    assert rows == {"set": 1800.0, "absent": None}
