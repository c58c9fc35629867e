"""Fixtures of the end-to-end tests: a fresh migrated PostgreSQL ledger, settings pointing at it
and at an embedded provider sim + gateway, and the session's Prefect server."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from evalfleet.embedded import EmbeddedStack, start_stack
from evalfleet.settings import get_settings
from gateway.provider_sim.profile import DEFAULT_PROFILE, profile_from
from gateway.serving import free_port
from tasks import ledger_io
from tests.pg_support import sibling_database

ADMIN_KEY = "sim-admin-" + uuid.uuid4().hex


@pytest.fixture
def e2e_ledger_url(pg_database: str) -> Iterator[str]:
    with sibling_database(pg_database, "e2e") as url:
        yield url
        ledger_io.engine().dispose()


@pytest.fixture
def e2e_env(
    prefect_api_url: str, e2e_ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., EmbeddedStack]]:
    """Settings for an embedded run on fresh ports; yields a starter of the provider + gateway."""
    sim_port, gw_port = free_port(), free_port()
    env = {
        "EVALFLEET_DATABASE_URL": e2e_ledger_url,
        "EVALFLEET_PROVIDER_ADMIN_KEY": ADMIN_KEY,
        "EVALFLEET_PROVIDER_SIM_URL": f"http://127.0.0.1:{sim_port}",
        "EVALFLEET_GATEWAY_URL": f"http://127.0.0.1:{gw_port}",
        "EVALFLEET_HEARTBEAT_S": "1",
        "EVALFLEET_VISIBILITY_TIMEOUT_S": "5",
        "EVALFLEET_DISPATCH_TICK_S": "0.2",
        "EVALFLEET_IN_PROCESS_THREADS": "8",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    get_settings.cache_clear()
    ledger_io.engine.cache_clear()
    ledger_io.sessions.cache_clear()
    stacks: list[EmbeddedStack] = []
    import prefect.context

    # prefect was imported before the session's server existed: let every thread see its URL
    prefect.context.refresh_global_settings_context()

    def start(**profile: Any) -> EmbeddedStack:
        data = {**DEFAULT_PROFILE, "output_fraction_min": 0.5, **profile}
        stack = start_stack(
            profile_from(data), SecretStr(ADMIN_KEY), sim_port=sim_port, gateway_port=gw_port
        )
        stacks.append(stack)
        return stack

    yield start
    for stack in stacks:
        stack.close()
    get_settings.cache_clear()
    ledger_io.engine.cache_clear()
    ledger_io.sessions.cache_clear()
