"""Whose clock the ledger uses: the database's on PostgreSQL, the (single) host's on SQLite.

Leases are compared against "now" by many workers on many machines; on PostgreSQL every "now"
is therefore the database's ``now()`` (the transaction's start time), never a worker's clock.
A SQLite ledger lives on one machine, so its "now" is that machine's UTC clock, passed as a
typed bound value (SQLAlchemy's SQLite DATETIME format) so comparisons of stored values stay
consistent. Values read back from SQLite are naive; ``as_utc`` makes them aware.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, Interval, func, literal
from sqlalchemy.sql.elements import ColumnElement

from ledger.models import UtcDateTime


def as_utc(value: datetime) -> datetime:
    """An aware UTC datetime (naive values from SQLite are UTC by construction)."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def db_now(conn: Connection) -> ColumnElement[datetime]:
    """SQL for "now": ``now()`` on PostgreSQL, the host's UTC clock as a bound value on SQLite."""
    if conn.dialect.name == "postgresql":
        return func.now()
    return literal(datetime.now(UTC), UtcDateTime)


def db_now_plus(conn: Connection, seconds: float) -> ColumnElement[datetime]:
    """SQL for "now + seconds" on the same clock as ``db_now``."""
    if conn.dialect.name == "postgresql":
        return func.now() + literal(timedelta(seconds=seconds), Interval())
    return literal(datetime.now(UTC) + timedelta(seconds=seconds), UtcDateTime)


def host_now() -> datetime:
    """The host's UTC clock (SQLite ledgers only: on PostgreSQL use the database's ``now()``)."""
    return datetime.now(UTC)


def sqlite_timestamp(value: datetime) -> str:
    """``value`` in the text format SQLAlchemy stores SQLite DATETIMEs in (UTC, microseconds),
    for hand-written SQL whose values must compare correctly with ORM-written ones."""
    utc = as_utc(value)
    return (
        f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d} "
        f"{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}.{utc.microsecond:06d}"
    )
