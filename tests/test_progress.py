"""Run progress (tasks.progress): computed from the ledger, mirrored to a Valkey/Redis hash that
is rebuilt equal after a wipe, kept as a Prefect progress artifact, printed by `evalfleet status`."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner
from sqlalchemy import insert, update

from evalfleet.settings import get_settings
from evalfleet.states import RunState
from ledger.models import InstanceResult, LlmCall, PlannerDecision
from ledger.runs import NewRun, create_run
from tasks import ledger_io, progress

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def _reset_caches() -> None:
    get_settings.cache_clear()
    ledger_io.engine.cache_clear()
    progress._valkey.cache_clear()


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh SQLite ledger holding one run of 5 instances in mixed states, with calls."""
    monkeypatch.setenv("EVALFLEET_DATABASE_URL", f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    monkeypatch.delenv("EVALFLEET_VALKEY_URL", raising=False)
    _reset_caches()
    run_id = str(uuid.uuid4())
    engine = ledger_io.engine()
    create_run(
        engine,
        NewRun(
            run_id=run_id,
            name="progress",
            harness="simulated",
            alias="sim-openai",
            instance_ids=[f"i{n}" for n in range(5)],
            spend_cap_micro_usd=1_000_000,
            state=RunState.RUNNING,
        ),
    )
    with engine.begin() as conn:
        for instance, state in (("i0", "resolved"), ("i1", "unresolved"), ("i2", "running")):
            conn.execute(
                update(InstanceResult)
                .where(InstanceResult.run_id == run_id, InstanceResult.instance_id == instance)
                .values(state=state, started_at=T0, finished_at=T0 + timedelta(seconds=9))
            )
        conn.execute(
            insert(LlmCall),
            [
                {
                    "run_id": run_id,
                    "instance_id": f"i{n % 3}",
                    "alias": "sim-openai",
                    "requested_at": T0 + timedelta(seconds=n),
                    "input_tokens": 1000,
                    "cached_input_tokens": 400,
                    "output_tokens": 50,
                    "status": 429 if n == 3 else 200,
                    "cost_micro_usd": 0 if n == 3 else 120,
                }
                for n in range(6)
            ],
        )
        conn.execute(
            insert(PlannerDecision).values(
                **_decision_row(), alias="sim-openai", tick_at=T0, ceiling=7, binding="paced"
            )
        )
    yield run_id
    _reset_caches()


def _decision_row() -> dict[str, object]:
    """The non-null columns of a planner_decisions row other than alias, tick, ceiling, binding."""
    from sqlalchemy import inspect

    cols = inspect(PlannerDecision).columns
    row: dict[str, object] = {}
    for col in cols:
        if col.primary_key or col.nullable or col.server_default is not None:
            continue
        if col.name in ("alias", "tick_at", "ceiling", "binding"):
            continue
        row[col.name] = 0
    return row


def test_progress_from_the_ledger(ledger: str) -> None:
    p = progress.from_ledger(ledger)
    assert p.counts == {"resolved": 1, "unresolved": 1, "running": 1, "queued": 2}
    assert (p.total, p.terminal, p.fraction_done) == (5, 2, 0.4)
    assert (p.calls, p.input_tokens, p.cached_input_tokens, p.output_tokens) == (
        6,
        6000,
        2400,
        300,
    )
    assert (p.cost_micro_usd, p.rate_limited) == (5 * 120, 1)
    assert (p.ceiling, p.binding, p.state) == (7, "paced", "running")
    # the latest change the ledger records: an instance finished at T0 + 9 s (calls end at +5 s)
    assert p.updated_at is not None
    assert p.updated_at.replace(tzinfo=UTC) >= T0 + timedelta(seconds=9)
    assert progress.Progress.from_hash(p.as_hash()) == p


def test_unknown_run_is_a_clear_error(ledger: str) -> None:
    from evalfleet.errors import NotFound

    with pytest.raises(NotFound, match="nope"):
        progress.from_ledger("nope")


def test_valkey_hash_is_rebuilt_equal_after_a_wipe(
    ledger: str, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EVALFLEET_VALKEY_URL", redis_url)
    _reset_caches()
    client = redis.Redis.from_url(redis_url, decode_responses=True, socket_timeout=5)
    written = progress.publish(ledger)
    stored = client.hgetall(progress.hash_key(ledger))
    assert stored["count:resolved"] == "1" and stored["terminal"] == "2"
    assert stored["cost_micro_usd"] == "600" and stored["rate_limited"] == "1"
    assert stored["updated_at"] == written.updated_at.isoformat()  # type: ignore[union-attr]
    client.flushdb()  # Valkey wiped: it is only derived
    assert client.hgetall(progress.hash_key(ledger)) == {}
    rebuilt = progress.read(ledger)
    assert rebuilt == written
    assert client.hgetall(progress.hash_key(ledger)) == stored
    # a later change replaces the hash (no stale per-state field is left behind)
    with ledger_io.engine().begin() as conn:
        conn.execute(
            update(InstanceResult)
            .where(InstanceResult.run_id == ledger, InstanceResult.instance_id == "i2")
            .values(state="resolved", finished_at=T0 + timedelta(seconds=30))
        )
    progress.publish_quietly(ledger)
    after = client.hgetall(progress.hash_key(ledger))
    assert "count:running" not in after and after["count:resolved"] == "2"
    assert progress.read(ledger).terminal == 3


def test_without_a_valkey_url_progress_comes_from_the_ledger(ledger: str) -> None:
    assert progress.valkey() is None
    progress.publish_quietly(ledger)  # nothing to publish to, no error
    assert progress.read(ledger) == progress.from_ledger(ledger)


def test_status_prints_the_ledger_progress(ledger: str) -> None:
    from evalfleet.cli import _register_all, cli, main

    _register_all()
    result = CliRunner().invoke(cli, ["status", ledger], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    line = result.output.strip()
    assert line.startswith(f"{ledger} progress [running] 2/5 done")
    for part in (
        "queued=2",
        "resolved=1",
        "running=1",
        "calls 6",
        "$0.0006",
        "429s 1",
        "ceiling 7 (paced)",
    ):
        assert part in line, part
    assert main(["status", "no-such-run"]) == 2


def _artifacts(key: str) -> list[Any]:
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    with get_client(sync_client=True) as client:
        return client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), limit=10
        )


@pytest.mark.prefect
def test_a_prefect_progress_artifact_per_run(ledger: str, prefect_api_url: str) -> None:
    from prefect import flow

    # as in production (the supervisor's and instances' flows): artifacts come from a flow run
    @flow(name="progress-artifact-test", persist_result=False)
    def publish_first() -> object:
        return progress.publish_artifact(progress.from_ledger(ledger))

    @flow(name="progress-artifact-test", persist_result=False)
    def publish_all() -> list[progress.Progress]:
        return progress.publish_runs([ledger])

    key = progress.artifact_key(ledger)
    first = publish_first()
    [art] = _artifacts(key)
    assert art.id == first and art.type == "progress"
    assert float(art.data) == 40.0
    assert "2/5 done" in (art.description or "")
    with ledger_io.engine().begin() as conn:
        conn.execute(
            update(InstanceResult)
            .where(InstanceResult.run_id == ledger)
            .values(state="resolved", finished_at=T0 + timedelta(seconds=60))
        )
    published = publish_all()
    assert [p.terminal for p in published] == [5]
    [again] = _artifacts(key)  # updated in place, not a second artifact
    assert again.id == first and float(again.data) == 100.0
    assert "5/5 done" in (again.description or "")
