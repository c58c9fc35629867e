"""The control flows (what an operator runs from the Prefect UI), run on the session's Prefect
server against a SQLite ledger: they change the ledger with one audit row (actor prefect-ui by
default) and a bad value fails the flow run with the ConfigError's message."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select

from evalfleet.errors import ConfigError
from ledger.db import make_engine
from ledger.migrate import upgrade
from ledger.models import AuditLog, Run
from ledger.runs import NewRun, create_run


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    from evalfleet.settings import get_settings
    from tasks import ledger_io

    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    monkeypatch.setenv("EVALFLEET_DATABASE_URL", url)
    for cached in (get_settings, ledger_io.engine, ledger_io.sessions):
        cached.cache_clear()
    upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()
    for cached in (get_settings, ledger_io.engine, ledger_io.sessions):
        cached.cache_clear()


def test_control_flows_change_the_ledger_with_an_audit_row(
    prefect_api_url: str, ledger: Engine
) -> None:
    from flows import controls as control_flows

    run_id = str(uuid.uuid4())
    create_run(
        ledger,
        NewRun(
            run_id=run_id,
            name="r",
            harness="simulated",
            alias="sim-anthropic",
            instance_ids=["a"],
            spend_cap_micro_usd=1_000_000,
            max_attempts=3,
        ),
    )
    out: Any = control_flows.set_task_cap(run_id=run_id, cap=2, reason="from the UI")
    assert out == {"old": {"task_cap": None}, "new": {"task_cap": 2}}
    out = control_flows.set_pacer(alias="sim-anthropic", calls_per_s=4.5, reason="slower")
    assert out["new"]["calls_per_s"] == 4.5
    with pytest.raises(ConfigError, match="output_tokens_per_s"):
        control_flows.set_pacer(alias="sim-anthropic", output_tokens_per_s=-3.0, reason="x")
    with ledger.connect() as conn:
        assert conn.execute(select(Run.task_cap).where(Run.id == run_id)).scalar_one() == 2
        audits = conn.execute(select(AuditLog.action, AuditLog.actor)).all()
    assert [tuple(a) for a in audits] == [
        ("run.task_cap", "prefect-ui"),
        ("pacer.set", "prefect-ui"),
    ]
