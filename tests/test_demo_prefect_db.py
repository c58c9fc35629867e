"""The demo's optional PostgreSQL-backed Prefect server (``evalfleet.embedded``): its database is
created once, and a bad URL is a clear error naming the option."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from evalfleet.embedded import ensure_postgres_database
from evalfleet.errors import ConfigError
from tests.conftest import PG_ADMIN_URL, _drop_pg_database, service_unavailable


def _exists(name: str) -> bool:
    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
    return row is not None


def test_the_database_is_created_once() -> None:
    name = f"evalfleet_demo_test_{uuid.uuid4().hex[:8]}"
    try:
        _exists(name)
    except psycopg.Error as exc:
        service_unavailable("PostgreSQL on 127.0.0.1:5432", exc)
    url = f"postgresql+asyncpg://postgres@127.0.0.1:5432/{name}"
    try:
        ensure_postgres_database(url, option="--prefect-db")
        assert _exists(name)
        ensure_postgres_database(url, option="--prefect-db")  # a second demo reuses it
        assert _exists(name)
    finally:
        _drop_pg_database(name)


@pytest.mark.parametrize(
    "url", ["not a url", "sqlite:///x.db", "postgresql+asyncpg://postgres@127.0.0.1:5432"]
)
def test_a_bad_url_names_the_option(url: str) -> None:
    with pytest.raises(ConfigError, match=r"^--prefect-db: "):
        ensure_postgres_database(url, option="--prefect-db")
