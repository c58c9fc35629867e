"""Fixtures of the ledger tests: a migrated ledger per test on SQLite and on PostgreSQL.

SQLite: a new file per test (cheap). PostgreSQL: one migrated database per session, created
beside the session's ``pg_database`` (so other areas' tests cannot disturb it), with the queue
tables truncated before each test. ``fresh_pg_url`` makes an empty database for migration tests.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import psycopg
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.engine import make_url

from ledger.db import make_engine
from ledger.migrate import upgrade

QUEUE_TABLES = ("jobs", "instance_results", "pause_flags", "runs")


def _admin(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _create_sibling(pg_database: str, suffix: str) -> str:
    name = f"{make_url(pg_database).database}_{suffix}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(_admin(pg_database), autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
    return make_url(pg_database).set(database=name).render_as_string(hide_password=False)


def _drop(pg_database: str, url: str) -> None:
    name = make_url(url).database
    with psycopg.connect(_admin(pg_database), autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')  # type: ignore[arg-type]


@pytest.fixture
def fresh_pg_url(pg_database: str) -> Iterator[str]:
    """An empty PostgreSQL database, dropped after the test."""
    url = _create_sibling(pg_database, "mig")
    yield url
    _drop(pg_database, url)


@pytest.fixture(scope="session")
def pg_ledger_session_url(pg_database: str) -> Iterator[str]:
    url = _create_sibling(pg_database, "ledger")
    upgrade(url)
    yield url
    _drop(pg_database, url)


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
