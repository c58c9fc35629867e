"""A run config without ``max_attempts`` takes the deployment's default
(``EVALFLEET_DEFAULT_MAX_ATTEMPTS``) when the run is written; a given value is kept. The stored
run (``runs.max_attempts`` and ``runs.config``) records the effective number, and the config
model itself reads no settings."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select

from evalfleet.runconfig import RunConfig
from evalfleet.settings import get_settings
from ledger.models import Run
from tasks import launch, ledger_io


def _config(**extra: Any) -> RunConfig:
    data = {
        "name": "defaults",
        "harness": {"name": "simulated", "options": {}},
        "alias": "sim-openai",
        "instances": ["a__1", "a__2"],
        "caps": {"spend_usd": 1.0},
        **extra,
    }
    return RunConfig.from_mapping(data, None)


@pytest.fixture
def ledger_with_default_5(
    sqlite_task_ledger: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """A fresh SQLite ledger, with the deployment's default max_attempts set to 5."""
    monkeypatch.setenv("EVALFLEET_DEFAULT_MAX_ATTEMPTS", "5")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _stored(run_id: str) -> tuple[int, Any]:
    with ledger_io.engine().connect() as conn:
        row = conn.execute(select(Run.max_attempts, Run.config).where(Run.id == run_id)).one()
    return row.max_attempts, row.config["max_attempts"]


def test_an_omitted_max_attempts_is_none_in_the_model() -> None:
    config = _config()
    assert config.max_attempts is None
    assert "max_attempts default" in config.summary()
    # "default" and an explicit value are different configs (different content hashes)
    assert config.content_hash != _config(max_attempts=3).content_hash


@pytest.mark.usefixtures("ledger_with_default_5")
def test_an_omitted_max_attempts_takes_the_deployments_default() -> None:
    run_id, created = launch.write_run(_config(), None, "omitted")
    assert created
    assert _stored(run_id) == (5, 5)


@pytest.mark.usefixtures("ledger_with_default_5")
@pytest.mark.parametrize("given", [1, 3, 20])
def test_a_given_max_attempts_is_kept(given: int) -> None:
    run_id, created = launch.write_run(_config(max_attempts=given), None, f"given-{given}")
    assert created
    assert _stored(run_id) == (given, given)
