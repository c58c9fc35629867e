"""Fixtures of the gateway tests: a migrated PostgreSQL ledger, the simulated provider and the
gateway served on loopback with real uvicorn, and a run with freshly minted keys."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from gateway.aliases import Aliases
from gateway.app import Gateway
from gateway.keys import MemoryKeyStore, ProviderAdminKeyMinter
from gateway.pacer_local import InProcessPacer
from gateway.provider_sim.server import ProviderSim
from gateway.serving import ServerThread
from ledger.db import make_engine
from tests.gateway.gw_helpers import ADMIN_KEY, Stack, fast_aliases, sim_profile
from tests.pg_support import sibling_database


@pytest.fixture(scope="session")
def gw_ledger_url(pg_database: str) -> Iterator[str]:
    with sibling_database(pg_database, "gw") as url:
        yield url


@pytest.fixture(scope="session")
def gw_engine(gw_ledger_url: str) -> Iterator[Engine]:
    engine = make_engine(gw_ledger_url)
    yield engine
    engine.dispose()


@pytest.fixture
def make_stack(gw_engine: Engine) -> Iterator[Callable[..., Stack]]:
    """Start a provider sim + gateway (in-process pacer unless given) for the test."""
    exits: list[Callable[[], None]] = []

    def start(
        profile: Any = None,
        aliases: Callable[[str], Aliases] | None = None,
        max_retry_wait_s: float = 0.0,
        pacer: Callable[[Aliases], Any] | None = None,
    ) -> Stack:
        sim = ProviderSim(profile or sim_profile(), ADMIN_KEY)
        sim_server = ServerThread(sim.app)
        sim_url = sim_server.__enter__()
        exits.append(lambda: sim_server.__exit__(None, None, None))
        resolved = (aliases or fast_aliases)(sim_url)
        store = MemoryKeyStore()
        gateway = Gateway(
            aliases=resolved,
            engine=gw_engine,
            store=store,
            pacer=(pacer or InProcessPacer)(resolved),
            max_retry_wait_s=max_retry_wait_s,
            pause_refresh_s=0.2,
        )
        gw_server = ServerThread(gateway.app)
        url = gw_server.__enter__()
        exits.append(lambda: gw_server.__exit__(None, None, None))
        return Stack(
            sim=sim,
            sim_url=sim_url,
            gateway=gateway,
            url=url,
            engine=gw_engine,
            minter=ProviderAdminKeyMinter(sim_url, ADMIN_KEY),
            store=store,
        )

    yield start
    for stop in reversed(exits):
        stop()


@pytest.fixture
def prefect_api(prefect_api_url: str) -> Iterator[str]:
    """The session's Prefect server, made current for this test (Prefect reads its settings
    once at import, before the session fixture set PREFECT_API_URL)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: prefect_api_url}):
        yield prefect_api_url
