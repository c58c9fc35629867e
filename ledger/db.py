"""Engines and sessions for the ledger, on SQLite (embedded default) and PostgreSQL (production).

Owns how evalfleet talks to its database, so that every caller gets the same safe defaults:

* SQLite: WAL journal (readers never block the writer), ``busy_timeout`` (a waiting writer
  retries instead of failing at once), ``foreign_keys=ON``, and pysqlite's own transaction
  handling switched off so that SQLAlchemy emits ``BEGIN IMMEDIATE`` itself. A write transaction
  that starts with ``BEGIN IMMEDIATE`` takes SQLite's single writer lock up front, so it can never
  fail half-way with "database is locked" when it upgrades from reading to writing. Read-only work
  can ask for a plain deferred ``BEGIN`` with ``readonly(engine)``.
* PostgreSQL through psycopg 3: a bounded pool with pre-ping, connect and pool timeouts.

Nothing here reads the environment: the URL is an argument (``get_settings().ledger_url``).
"""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.orm import Session, sessionmaker

from evalfleet.errors import ConfigError

#: Execution option naming how a SQLite transaction begins: "IMMEDIATE" (default) or "DEFERRED".
SQLITE_BEGIN_OPTION = "evalfleet_sqlite_begin"
SQLITE_BUSY_TIMEOUT_MS = 30_000
PG_CONNECT_TIMEOUT_S = 10


def is_sqlite(engine: Engine | Connection) -> bool:
    """True when the engine or connection talks to SQLite."""
    return engine.dialect.name == "sqlite"


def is_postgresql(engine: Engine | Connection) -> bool:
    """True when the engine or connection talks to PostgreSQL."""
    return engine.dialect.name == "postgresql"


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL (None for in-memory databases and for other databases)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    return Path(database)


def _install_sqlite_pragmas(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: sqlite3.Connection, _record: Any) -> None:
        # Let SQLAlchemy (below) emit BEGIN itself instead of pysqlite's implicit, deferred one.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA journal_mode = WAL")
            cursor.execute("PRAGMA synchronous = NORMAL")
            cursor.execute("PRAGMA foreign_keys = ON")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        mode = connection.get_execution_options().get(SQLITE_BEGIN_OPTION, "IMMEDIATE")
        if mode not in ("IMMEDIATE", "DEFERRED", "EXCLUSIVE"):
            raise ValueError(f"{SQLITE_BEGIN_OPTION} must be IMMEDIATE, DEFERRED or EXCLUSIVE")
        connection.exec_driver_sql(f"BEGIN {mode}")


def make_engine(url: str, *, pool_size: int = 10, max_overflow: int = 20) -> Engine:
    """An engine for the ledger at ``url`` (``sqlite:///file`` or ``postgresql+psycopg://...``).

    Raises ConfigError for a URL that is not SQLite or PostgreSQL, or that cannot be parsed.
    """
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        # The message would echo the URL, which may hold a password: name the problem only.
        raise ConfigError("database url", ["cannot parse the URL"]) from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        engine = create_engine(
            parsed,
            connect_args={"check_same_thread": False, "timeout": SQLITE_BUSY_TIMEOUT_MS / 1000},
            pool_pre_ping=False,
        )
        _install_sqlite_pragmas(engine)
        return engine
    if backend == "postgresql":
        if parsed.drivername in ("postgresql", "postgres"):
            parsed = parsed.set(drivername="postgresql+psycopg")
        if parsed.drivername != "postgresql+psycopg":
            raise ConfigError(
                "database url",
                [f"driver {parsed.drivername!r} is not supported; use postgresql+psycopg://"],
            )
        return create_engine(
            parsed,
            pool_size=pool_size,
            max_overflow=max_overflow,
            pool_timeout=30,
            pool_pre_ping=False,
            pool_recycle=1800,
            connect_args={"connect_timeout": PG_CONNECT_TIMEOUT_S},
        )
    raise ConfigError(
        "database url", [f"backend {backend!r} is not supported; use sqlite or postgresql"]
    )


def readonly(engine: Engine) -> Engine:
    """The same engine (same pool) whose SQLite transactions begin DEFERRED: for read-only work."""
    if is_sqlite(engine):
        return engine.execution_options(**{SQLITE_BEGIN_OPTION: "DEFERRED"})
    return engine


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """A sessionmaker bound to ``engine`` that keeps loaded attributes after commit."""
    return sessionmaker(bind=engine, expire_on_commit=False)


_WRITER_LOCKS: dict[str, threading.Lock] = {}
_WRITER_LOCKS_GUARD = threading.Lock()


def _writer_lock(engine: Engine) -> threading.Lock:
    key = str(engine.url.database)
    with _WRITER_LOCKS_GUARD:
        lock = _WRITER_LOCKS.get(key)
        if lock is None:
            lock = _WRITER_LOCKS[key] = threading.Lock()
        return lock


@contextlib.contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """One write transaction: commits on success, rolls back on any exception (re-raised).

    On SQLite the threads of one process also queue on a per-file lock before ``BEGIN
    IMMEDIATE``: SQLite's busy handler polls with growing sleeps, so without it one thread can
    starve the others (and throughput collapses); other processes still wait via busy_timeout.
    Do not nest write transactions on one SQLite file in one thread (it would deadlock).
    """
    if not is_sqlite(engine):
        with engine.begin() as connection:
            yield connection
        return
    lock = _writer_lock(engine)
    if not lock.acquire(timeout=SQLITE_BUSY_TIMEOUT_MS / 1000):
        raise TimeoutError(f"waited {SQLITE_BUSY_TIMEOUT_MS} ms for the SQLite writer lock")
    try:
        with engine.begin() as connection:
            yield connection
    finally:
        lock.release()


transaction = write_transaction
