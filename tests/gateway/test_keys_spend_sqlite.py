"""The spend reservation on the embedded default ledger (SQLite): same cap, same refusals."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import Engine, select

from evalfleet.errors import KeyRejected, SpendCapExceeded
from gateway.keys import hash_secret
from gateway.spend import Reservation, Settler, SpendStore
from ledger.db import make_engine, session_factory
from ledger.migrate import upgrade
from ledger.models import ApiKey, Run


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    upgrade(url)
    engine = make_engine(url)
    with session_factory(engine).begin() as s:
        s.add(
            Run(
                id="r1",
                name="n",
                harness="h",
                alias="a",
                state="running",
                spend_cap_micro_usd=100,
                max_attempts=1,
                config={},
            )
        )
    with session_factory(engine).begin() as s:
        s.add(
            ApiKey(
                id="k1",
                run_id="r1",
                kind="gateway",
                key_hash=hash_secret("secret-1"),
                spend_cap_micro_usd=100,
                spent_micro_usd=0,
                reserved_micro_usd=0,
                state="active",
                expires_at=datetime.now(UTC) + timedelta(hours=1),
            )
        )
    yield engine
    engine.dispose()


def test_sqlite_cap_admits_exactly_what_fits_and_settles(sqlite_engine: Engine) -> None:
    async def run() -> tuple[list[Reservation], list[SpendCapExceeded]]:
        store = SpendStore(sqlite_engine)
        settler = Settler(store)
        results = await asyncio.gather(
            *(store.reserve(hash_secret("secret-1"), 10, datetime.now(UTC)) for _ in range(15)),
            return_exceptions=True,
        )
        admitted = [r for r in results if not isinstance(r, BaseException)]
        refused = [r for r in results if isinstance(r, SpendCapExceeded)]
        for r in admitted:
            settler.add(r, 7)
        await settler.flush()
        with pytest.raises(KeyRejected, match="unknown"):
            await store.reserve(hash_secret("nope"), 1, datetime.now(UTC))
        await store.close()
        return admitted, refused

    admitted, refused = asyncio.run(run())
    assert (len(admitted), len(refused)) == (10, 5)
    with sqlite_engine.connect() as conn:
        spent, reserved = conn.execute(
            select(ApiKey.spent_micro_usd, ApiKey.reserved_micro_usd)
        ).one()
    assert (spent, reserved) == (70, 0)
