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
moves the reservation to ``spent`` at the real cost. Authentication and reservation are the
same statement, so a revoked key is refused from the very next call.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from evalfleet.errors import KeyRejected, SpendCapExceeded
from gateway.keys import KIND_GATEWAY, STATE_ACTIVE
from ledger.models import ApiKey


@dataclass(frozen=True)
class Reservation:
    """A reservation held by one call in flight."""

    key_id: str
    run_id: str
    amount: int


def reserve(
    sessions: sessionmaker[Session], key_hash: str, amount: int, now: datetime
) -> Reservation:
    """Reserve ``amount`` micro-USD on the gateway key with hash ``key_hash``, or raise."""
    with sessions.begin() as session:
        row = session.execute(
            update(ApiKey)
            .where(
                ApiKey.key_hash == key_hash,
                ApiKey.kind == KIND_GATEWAY,
                ApiKey.state == STATE_ACTIVE,
                ApiKey.expires_at > now,
                ApiKey.spent_micro_usd + ApiKey.reserved_micro_usd + amount
                <= ApiKey.spend_cap_micro_usd,
            )
            .values(reserved_micro_usd=ApiKey.reserved_micro_usd + amount)
            .returning(ApiKey.id, ApiKey.run_id)
        ).first()
        if row is not None:
            return Reservation(key_id=str(row[0]), run_id=str(row[1]), amount=amount)
        key = session.execute(
            select(ApiKey).where(ApiKey.key_hash == key_hash, ApiKey.kind == KIND_GATEWAY)
        ).scalar_one_or_none()
    if key is None:
        raise KeyRejected("unknown")
    if key.state != STATE_ACTIVE:
        raise KeyRejected(key.state)
    if _aware(key.expires_at) <= now:
        raise KeyRejected("expired")
    raise SpendCapExceeded(
        run_id=str(key.run_id),
        cap=key.spend_cap_micro_usd,
        spent=key.spent_micro_usd,
        reserved=key.reserved_micro_usd,
        requested=amount,
    )


def settle(sessions: sessionmaker[Session], reservation: Reservation, actual: int) -> None:
    """Release the reservation and add the call's real cost to the key's spend."""
    with sessions.begin() as session:
        session.execute(
            update(ApiKey)
            .where(ApiKey.id == reservation.key_id)
            .values(
                reserved_micro_usd=ApiKey.reserved_micro_usd - reservation.amount,
                spent_micro_usd=ApiKey.spent_micro_usd + actual,
            )
        )


def _aware(value: datetime) -> datetime:
    """SQLite returns naive datetimes for timezone-aware columns: they are UTC."""
    from datetime import UTC

    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
