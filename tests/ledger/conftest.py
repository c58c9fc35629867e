"""Fixtures of the ledger tests: a migrated ledger per test on SQLite and on PostgreSQL.

SQLite: a new file per test (cheap). PostgreSQL: one migrated database per session, created
beside the session's ``pg_database`` (so other areas' tests cannot disturb it), with the queue
tables truncated before each test. ``fresh_pg_url`` makes an empty database for migration tests.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from sqlalchemy import Engine, text

from ledger.db import make_engine
from ledger.migrate import upgrade
from tests.pg_support import sibling_database

QUEUE_TABLES = ("jobs", "instance_results", "pause_flags", "runs")


@pytest.fixture
def fresh_pg_url(pg_database: str) -> Iterator[str]:
    """An empty PostgreSQL database, dropped after the test."""
    with sibling_database(pg_database, "mig", migrate=False) as url:
        yield url


@pytest.fixture(scope="session")
def pg_ledger_session_url(pg_database: str) -> Iterator[str]:
    with sibling_database(pg_database, "ledger") as url:
        yield url


@pytest.fixture(scope="session")
def pg_ledger_session_engine(pg_ledger_session_url: str) -> Iterator[Engine]:
    engine = make_engine(pg_ledger_session_url)
    yield engine
    engine.dispose()


def _truncate(engine: Engine) -> None:
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {', '.join(QUEUE_TABLES)} RESTART IDENTITY CASCADE"))


@pytest.fixture
def sqlite_ledger_url(tmp_path) -> str:  # type: ignore[no-untyped-def]
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    upgrade(url)
    return url


@pytest.fixture(params=["sqlite", "postgresql"])
def ledger_url(request: pytest.FixtureRequest, tmp_path) -> str:  # type: ignore[no-untyped-def]
    """A migrated, empty ledger (queue tables) on each database in turn."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
        upgrade(url)
        return url
    engine = request.getfixturevalue("pg_ledger_session_engine")
    _truncate(engine)
    return str(request.getfixturevalue("pg_ledger_session_url"))


@pytest.fixture
def ledger_engine(ledger_url: str) -> Iterator[Engine]:
    engine = make_engine(ledger_url)
    yield engine
    engine.dispose()


EngineFactory = Callable[[str], Engine]
