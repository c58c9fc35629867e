"""Shared test fixtures: real PostgreSQL and Redis on 127.0.0.1, and one Prefect server per session.

In CI (``CI=true``) a missing service fails the test; on a laptop it skips with the reason.
Each test session gets its own PostgreSQL databases (dropped at the end), so parallel sessions
on one machine do not collide.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_ADMIN_URL = os.environ.get(
    "EVALFLEET_TEST_PG_ADMIN", "postgresql://postgres@127.0.0.1:5432/test"
)
REDIS_URL = os.environ.get("EVALFLEET_TEST_REDIS", "redis://127.0.0.1:6379/15")
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}
ROOT = Path(__file__).resolve().parent.parent

# Keep Prefect away from ~/.prefect and make a missing server loud instead of slow.
_PREFECT_HOME = tempfile.mkdtemp(prefix="evalfleet-test-prefect-")
os.environ.setdefault("PREFECT_HOME", _PREFECT_HOME)
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_ENABLED", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("PREFECT_LOGGING_TO_API_ENABLED", "false")


def service_unavailable(what: str, error: Exception) -> None:
    """Fail in CI, skip elsewhere: a test that needs a service must not silently pass."""
    message = f"{what} is not reachable: {error}"
    if IN_CI:
        pytest.fail(message)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _pg_admin_execute(sql: str) -> None:
    import psycopg

    with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=5) as conn:
        conn.execute(sql)


def _make_pg_database(prefix: str) -> str:
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    try:
        _pg_admin_execute(f'CREATE DATABASE "{name}"')
    except Exception as exc:
        service_unavailable("PostgreSQL on 127.0.0.1:5432", exc)
    return name


def _drop_pg_database(name: str) -> None:
    # Best effort at teardown: a database left behind is harmless, a teardown error is noise.
    with contextlib.suppress(Exception):
        _pg_admin_execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """An empty PostgreSQL database for this test session; yields a psycopg SQLAlchemy URL."""
    name = _make_pg_database("evalfleet_test")
    yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    _drop_pg_database(name)


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A Redis/Valkey database (index 15) flushed before and after the test."""
    import redis

    client = redis.Redis.from_url(REDIS_URL, socket_timeout=5)
    try:
        client.ping()
    except Exception as exc:
        service_unavailable("Redis on 127.0.0.1:6379", exc)
    client.flushdb()
    yield REDIS_URL
    client.flushdb()
    client.close()


def _refresh_prefect_settings() -> None:
    """Prefect snapshots its settings when ``prefect.context`` is first imported: if a test
    imported Prefect before this server existed, make it see PREFECT_API_URL now."""
    context = sys.modules.get("prefect.context")
    if context is not None:
        context.refresh_global_settings_context()


@pytest.fixture(scope="session")
def prefect_api_url() -> Iterator[str]:
    """One real Prefect server for the whole test session, on its own PostgreSQL database."""
    from evalfleet.embedded import PrefectServerError, prefect_server

    db = _make_pg_database("evalfleet_prefect")
    try:
        with prefect_server(
            f"postgresql+asyncpg://postgres@127.0.0.1:5432/{db}",
            port=free_port(),
            start_timeout_s=90.0,
        ) as server:
            previous = os.environ.get("PREFECT_API_URL")
            os.environ["PREFECT_API_URL"] = server.api_url
            _refresh_prefect_settings()
            try:
                yield server.api_url
            finally:
                if previous is None:
                    os.environ.pop("PREFECT_API_URL", None)
                else:
                    os.environ["PREFECT_API_URL"] = previous
                _refresh_prefect_settings()
    except PrefectServerError as exc:
        pytest.fail(str(exc))
    finally:
        _drop_pg_database(db)


@pytest.fixture(autouse=True)
def _close_prefect_event_stream(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used the Prefect server, stop Prefect's events worker. Left running,
    its websocket to the server stays open for the rest of the session, and the websockets
    library's keepalive draws each ping's payload from the global ``random`` module every 20 s
    in a background thread: a ping that lands while Hypothesis draws an example reads as a
    strategy using ``random`` (a HypothesisDeprecationWarning, which Hypothesis will make an
    error) in whichever property test happens to run then. The next test that emits an event
    starts a new worker."""
    yield
    if "prefect_api_url" not in request.fixturenames:
        return
    worker = sys.modules.get("prefect.events.worker")
    if worker is not None:
        worker.EventsWorker.drain_all(timeout=10.0, at_exit=False)


@pytest.fixture
def sqlite_task_ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh SQLite ledger as the tasks' (``tasks.ledger_io``, from
    ``EVALFLEET_DATABASE_URL``), with the settings and engine caches cleared around the test."""
    from evalfleet.settings import get_settings
    from tasks import ledger_io

    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    monkeypatch.setenv("EVALFLEET_DATABASE_URL", url)
    get_settings.cache_clear()
    ledger_io.engine.cache_clear()
    ledger_io.sessions.cache_clear()
    yield url
    ledger_io.engine().dispose()
    get_settings.cache_clear()
    ledger_io.engine.cache_clear()
    ledger_io.sessions.cache_clear()
