"""Spend accounting of the gateway: reserve a call's worst case, settle its real cost.

A call is forwarded only after its worst-case cost (every input token uncached, ``max_tokens``
of output) is reserved against the run's gateway key with ONE conditional UPDATE::

    UPDATE api_keys SET reserved = reserved + :cost
     WHERE key_hash = :h AND kind = 'gateway' AND state = 'active' AND expires_at > :now
       AND spent + reserved + :cost <= spend_cap
    RETURNING id, run_id

so concurrent calls can never together pass the cap (the row lock serialises them on
PostgreSQL; SQLite has one writer). When no row comes back, a second read says why: unknown,
revoked or expired key (``KeyRejected`` → 401) or the cap (``SpendCapExceeded``). Settlement
moves the reservation to ``spent`` at the real cost; the gateway batches settlements
(``Settler``: summed per key, one statement per 50 ms) to keep them off the hot path. Authentication and reservation are the
same statement, so a revoked key is refused from the very next call.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine, Table, bindparam, event, select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from evalfleet.errors import EvalfleetError, KeyRejected, SpendCapExceeded
from gateway.keys import KIND_GATEWAY, STATE_ACTIVE
from ledger.db import make_engine
from ledger.models import ApiKey

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Reservation:
    """A reservation held by one call in flight."""

    key_id: str
    run_id: str
    amount: int


_TABLE = ApiKey.__table__
assert isinstance(_TABLE, Table)
_KEYS = _TABLE.c
_RESERVE = (
    update(_TABLE)
    .where(
        _KEYS.key_hash == bindparam("b_hash"),
        _KEYS.kind == KIND_GATEWAY,
        _KEYS.state == STATE_ACTIVE,
        _KEYS.expires_at > bindparam("now"),
        _KEYS.spent_micro_usd + _KEYS.reserved_micro_usd + bindparam("amount")
        <= _KEYS.spend_cap_micro_usd,
    )
    .values(reserved_micro_usd=_KEYS.reserved_micro_usd + bindparam("amount"))
    .returning(_KEYS.id, _KEYS.run_id)
)
"""The reservation: built once (its compiled form is cached), run with parameters."""


def _reserve_statement(key_hash: str, amount: int, now: datetime) -> tuple[Any, dict[str, Any]]:
    return _RESERVE, {"b_hash": key_hash, "amount": amount, "now": now}


def _explain_statement(key_hash: str) -> Any:
    return select(ApiKey).where(ApiKey.key_hash == key_hash, ApiKey.kind == KIND_GATEWAY)


def _refusal(key: Any, amount: int, now: datetime) -> EvalfleetError:
    """Why a reservation was refused, from the key's row (None: unknown key)."""
    if key is None:
        return KeyRejected("unknown")
    if key.state != STATE_ACTIVE:
        return KeyRejected(key.state)
    if _aware(key.expires_at) <= now:
        return KeyRejected("expired")
    return SpendCapExceeded(
        run_id=str(key.run_id),
        cap=key.spend_cap_micro_usd,
        spent=key.spent_micro_usd,
        reserved=key.reserved_micro_usd,
        requested=amount,
    )


def reserve(engine: Engine, key_hash: str, amount: int, now: datetime) -> Reservation:
    """Reserve ``amount`` micro-USD on the gateway key with hash ``key_hash``, or raise."""
    with engine.begin() as conn:
        row = conn.execute(*_reserve_statement(key_hash, amount, now)).first()
        if row is not None:
            return Reservation(key_id=str(row[0]), run_id=str(row[1]), amount=amount)
        key = conn.execute(_explain_statement(key_hash)).one_or_none()
    raise _refusal(key, amount, now)


POOL_SIZE = 8


class SpendStore:
    """Reservations and settlements for the gateway's event loop.

    PostgreSQL: an asyncio engine (psycopg's async driver) in autocommit with
    ``synchronous_commit = off`` (see ``spend_engine``) — no thread hop, one round trip per
    reservation. SQLite: the same statements on ``spend_engine`` in a worker thread.
    """

    def __init__(self, ledger: Engine) -> None:
        self.sync_engine = spend_engine(ledger)
        self._async: AsyncEngine | None = None
        if ledger.dialect.name == "postgresql":
            # A fixed pool and a semaphore of the same size: connections are never opened and
            # closed per call (overflow connections would be, at every burst).
            self._async = create_async_engine(
                ledger.url, pool_size=POOL_SIZE, max_overflow=0, isolation_level="AUTOCOMMIT"
            )
            event.listen(self._async.sync_engine, "connect", _no_sync_commit)
        self._slots = asyncio.Semaphore(POOL_SIZE)

    async def reserve(self, key_hash: str, amount: int, now: datetime) -> Reservation:
        if self._async is None:
            return await asyncio.to_thread(reserve, self.sync_engine, key_hash, amount, now)
        async with self._slots, self._async.connect() as conn:
            row = (await conn.execute(*_reserve_statement(key_hash, amount, now))).first()
            if row is not None:
                return Reservation(key_id=str(row[0]), run_id=str(row[1]), amount=amount)
            key = (await conn.execute(_explain_statement(key_hash))).one_or_none()
        raise _refusal(key, amount, now)

    async def settle_many(self, deltas: dict[str, tuple[int, int]]) -> None:
        await asyncio.to_thread(settle_many, self.sync_engine, deltas)

    async def close(self) -> None:
        if self._async is not None:
            await self._async.dispose()
            self.sync_engine.engine.dispose()  # its own pool (SQLite shares the ledger's)


def settle(engine: Engine, reservation: Reservation, actual: int) -> None:
    """Release the reservation and add the call's real cost to the key's spend."""
    settle_many(engine, {reservation.key_id: (reservation.amount, actual)})


def settle_many(engine: Engine, deltas: dict[str, tuple[int, int]]) -> None:
    """Settle several calls at once: per key id, (reservations to release, cost to add)."""
    if not deltas:
        return
    with engine.begin() as conn:
        conn.execute(
            update(ApiKey)
            .where(ApiKey.id == bindparam("key_id"))
            .values(
                reserved_micro_usd=ApiKey.reserved_micro_usd - bindparam("release"),
                spent_micro_usd=ApiKey.spent_micro_usd + bindparam("cost"),
            )
            .execution_options(synchronize_session=False),
            [
                {"key_id": key_id, "release": release, "cost": cost}
                for key_id, (release, cost) in deltas.items()
            ],
        )


class Settler:
    """Batches settlements off the hot path: deltas are summed per key and written together
    (one UPDATE statement per flush), every ``interval_s`` or on ``flush()``."""

    def __init__(self, store: SpendStore, interval_s: float = 0.05) -> None:
        self._store = store
        self._interval_s = interval_s
        self._pending: dict[str, tuple[int, int]] = {}
        self._task: asyncio.Task[None] | None = None
        self._lock = asyncio.Lock()

    def add(self, reservation: Reservation, actual: int) -> None:
        release, cost = self._pending.get(reservation.key_id, (0, 0))
        self._pending[reservation.key_id] = (release + reservation.amount, cost + actual)

    @property
    def pending(self) -> int:
        return len(self._pending)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="evalfleet-spend-settler")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.flush()

    async def flush(self) -> None:
        async with self._lock:
            deltas, self._pending = self._pending, {}
            if not deltas:
                return
            try:
                await self._store.settle_many(deltas)
            except SQLAlchemyError as exc:
                log.error("settling %d keys failed (%s); retrying", len(deltas), type(exc).__name__)
                for key_id, (release, cost) in deltas.items():
                    r, c = self._pending.get(key_id, (0, 0))
                    self._pending[key_id] = (r + release, c + cost)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self.flush()


def spend_engine(ledger: Engine) -> Engine:
    """The engine of the gateway's hot path. PostgreSQL: its own small pool on the ledger's
    database, in autocommit (each reservation is ONE statement, one round trip, atomic by
    itself). SQLite: the ledger's engine itself (its transactions take the single writer lock).

    On PostgreSQL its connections also use ``synchronous_commit = off``: waiting for a WAL
    flush per call (milliseconds, far more on a busy disk) would dominate the gateway's added
    latency. The trade-off: if PostgreSQL itself crashes, the last few hundred milliseconds of
    reservations and settlements may be lost (never corrupted) — reservations are transient,
    and the provider key's own spend cap stays the backstop. Every other ledger write keeps
    full durability (other engines/connections are not affected).
    """
    if ledger.dialect.name != "postgresql":
        return ledger  # SQLite: the ledger's own engine (BEGIN IMMEDIATE: one writer at a time)
    url = ledger.url.render_as_string(hide_password=False)
    engine = make_engine(url, pool_size=8, max_overflow=8).execution_options(
        isolation_level="AUTOCOMMIT"
    )
    event.listen(engine.engine, "connect", _no_sync_commit)
    return engine


def _no_sync_commit(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("SET synchronous_commit = off")
    finally:
        cursor.close()
    dbapi_connection.commit()


def _aware(value: datetime) -> datetime:
    """SQLite returns naive datetimes for timezone-aware columns: they are UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
