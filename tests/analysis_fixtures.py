"""Shared fixtures of the analysis, ledger-curves and notebook tests: a simulated run, landed in
a migrated SQLite ledger (and, where a test asks for it, in a PostgreSQL one)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import Engine

from analysis.simfill import SimulatedRun, demo_scenario, simulate, write_simulated_run
from ledger.db import make_engine
from ledger.migrate import upgrade
from tests.pg_support import sibling_database

START = datetime(2026, 1, 5, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="session")
def sim_run() -> SimulatedRun:
    """The demo scenario simulated once per session (deterministic)."""
    return simulate(demo_scenario())


@pytest.fixture(scope="module")
def sim_ledger(
    tmp_path_factory: pytest.TempPathFactory, sim_run: SimulatedRun
) -> Iterator[tuple[str, str]]:
    """(ledger URL, run id): a migrated SQLite ledger holding the simulated run."""
    path: Path = tmp_path_factory.mktemp("simledger") / "ledger.sqlite3"
    url = f"sqlite:///{path}"
    upgrade(url)
    engine = make_engine(url)
    run_id = write_simulated_run(engine, sim_run, start_at=START)
    engine.dispose()
    yield url, run_id


@pytest.fixture
def sim_engine(sim_ledger: tuple[str, str]) -> Iterator[Engine]:
    engine = make_engine(sim_ledger[0])
    yield engine
    engine.dispose()


@pytest.fixture
def fresh_pg_ledger_url(pg_database: str) -> Iterator[str]:
    """An empty PostgreSQL database beside the session's, dropped after the test."""
    with sibling_database(pg_database, "curves", migrate=False) as url:
        yield url
