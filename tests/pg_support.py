"""A fresh PostgreSQL database beside the session's (``pg_database``), for fixtures that need a
ledger of their own: created, migrated to head unless told not to, and dropped on exit. Import
with ``from tests.pg_support import sibling_database``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy.engine import make_url

from ledger.migrate import upgrade


def _admin(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _execute(pg_database: str, sql: str) -> None:
    with psycopg.connect(_admin(pg_database), autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql)


@contextmanager
def sibling_database(pg_database: str, tag: str, *, migrate: bool = True) -> Iterator[str]:
    """A database named after the session's and ``tag``; yields its SQLAlchemy URL."""
    base = make_url(pg_database)
    name = f"{base.database}_{tag}_{uuid.uuid4().hex[:6]}"
    _execute(pg_database, f'CREATE DATABASE "{name}"')
    url = base.set(database=name).render_as_string(hide_password=False)
    try:
        if migrate:
            upgrade(url)
        yield url
    finally:
        _execute(pg_database, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
