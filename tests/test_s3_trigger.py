"""End to end on the session's Prefect server: a run config dropped into a (moto) S3 bucket
becomes a ``launch-run`` flow run through the watcher's event and the launch automation.

Also shows: the automation is applied idempotently; a restarted watcher sends nothing again, so
there is still one flow run; oversized and malformed objects are recorded as rejected and start
nothing; and running the launch flow with the flow run's own parameters twice (an event
delivered twice) writes ONE run, whose config_source and idempotency key name the object version.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from deployments.s3 import S3Watcher, apply_s3_trigger, automation_name, prefect_emitter
from evalfleet.config_sources import MAX_CONFIG_BYTES
from ledger.db import make_engine
from ledger.migrate import upgrade
from ledger.models import Run

pytest_plugins = ["s3_support"]

POOL = "evalfleet-s3-test"
DEPLOYMENT = "s3-test-launch"
BUCKET = "launch-drops"
ALIASES = """aliases:
  - name: s3-alias
    flavour: openai
    base_url: http://127.0.0.1:9
    model: m
    prices: {input_per_mtok: 1, cached_input_per_mtok: 1, output_per_mtok: 1}
    cached_input_counts: true
    key_minter: prefect_secret
    static_key_block: s3-test-provider-key
    pacer: {calls_per_s: 1, tokens_per_s: 100, inflight_tokens: 1000, burst_s: 1, cooldown_s: 1}
"""
CONFIG = b"""name: from-s3
harness: {name: simulated}
alias: s3-alias
instances: [a__a-1, b__b-2, c__c-3]
caps: {spend_usd: 1}
"""


def _register_launch_deployment() -> Any:
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    # Imported, not loaded from its entrypoint path: loading by path puts flows/ on sys.path
    # for the rest of the test process.
    from flows.launch import launch_run as flow

    with get_client(sync_client=True) as client:
        with contextlib.suppress(ObjectAlreadyExists):
            client.create_work_pool(WorkPoolCreate(name=POOL, type="process"))
        flow_id = client.create_flow_from_name(flow.name)
        return client.create_deployment(
            flow_id=flow_id,
            name=DEPLOYMENT,
            entrypoint="flows/launch.py:launch_run",
            work_pool_name=POOL,
            parameter_openapi_schema=flow.parameters.model_dump(),
            enforce_parameter_schema=True,
        )


def _apply_trigger() -> str:
    from prefect import get_client

    async def apply() -> str:
        async with get_client() as client:
            return await apply_s3_trigger(client, BUCKET, "runs/", f"launch-run/{DEPLOYMENT}")

    return asyncio.run(apply())


def _flow_runs(deployment_id: Any) -> list[Any]:
    from prefect import get_client
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    with get_client(sync_client=True) as client:
        return list(
            client.read_flow_runs(
                deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id]))
            )
        )


def _wait_for_runs(deployment_id: Any, count: int, timeout_s: float = 30.0) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        runs = _flow_runs(deployment_id)
        if len(runs) >= count or time.monotonic() > deadline:
            return runs
        time.sleep(0.25)


@pytest.fixture
def launch_settings(tmp_path: Path, moto_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """Point evalfleet (ledger, aliases, S3 endpoint) at this test's own files and moto."""
    from evalfleet.settings import get_settings
    from tasks import ledger_io

    aliases = tmp_path / "aliases.yaml"
    aliases.write_text(ALIASES)
    url = f"sqlite:///{tmp_path / 'ledger.sqlite3'}"
    monkeypatch.setenv("EVALFLEET_DATABASE_URL", url)
    monkeypatch.setenv("EVALFLEET_ALIASES_FILE", str(aliases))
    monkeypatch.setenv("EVALFLEET_S3_ENDPOINT_URL", moto_endpoint)
    for cached in (get_settings, ledger_io.engine, ledger_io.sessions):
        cached.cache_clear()
    upgrade(url)
    engine = make_engine(url)
    yield engine
    engine.dispose()
    for cached in (get_settings, ledger_io.engine, ledger_io.sessions):
        cached.cache_clear()


@pytest.fixture
def cleanup_prefect(prefect_api_url: str) -> Iterator[None]:
    """Remove this test's automation, deployment and pool: the session server is shared."""
    yield
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    async def clean() -> None:
        async with get_client() as client:
            for automation in await client.read_automations_by_name(
                automation_name(BUCKET, "runs/")
            ):
                await client.delete_automation(automation.id)
            with contextlib.suppress(ObjectNotFound):
                dep = await client.read_deployment_by_name(f"launch-run/{DEPLOYMENT}")
                await client.delete_deployment(dep.id)
            with contextlib.suppress(ObjectNotFound):
                await client.delete_work_pool(POOL)

    asyncio.run(clean())


def test_a_dropped_config_becomes_one_launch_run(
    prefect_api_url: str, moto_s3: Any, launch_settings: Any, cleanup_prefect: None
) -> None:
    from prefect.blocks.system import Secret

    Secret(value="sk-static-provider-key").save("s3-test-provider-key", overwrite=True)
    deployment_id = _register_launch_deployment()
    assert _apply_trigger() in ("created", "updated")
    assert _apply_trigger() == "unchanged"

    moto_s3.create_bucket(Bucket=BUCKET)
    moto_s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    put = moto_s3.put_object(Bucket=BUCKET, Key="runs/eval.yaml", Body=CONFIG)
    moto_s3.put_object(Bucket=BUCKET, Key="runs/big.yaml", Body=b"#" * (MAX_CONFIG_BYTES + 1))
    moto_s3.put_object(Bucket=BUCKET, Key="runs/bad.json", Body=b'{"name": ')

    watcher = S3Watcher(
        s3=moto_s3, engine=launch_settings, bucket=BUCKET, prefix="runs/", emit=prefect_emitter()
    )
    report = watcher.poll_once()
    assert [i.key for i in report.emitted] == ["runs/eval.yaml"]
    assert sorted(i.key for i, _ in report.rejected) == ["runs/bad.json", "runs/big.yaml"]

    runs = _wait_for_runs(deployment_id, 1)
    uri = f"s3://{BUCKET}/runs/eval.yaml?versionId={put['VersionId']}"
    assert len(runs) == 1, "the automation did not create the launch flow run"
    assert runs[0].parameters == {"config_uri": uri}

    # A restarted watcher sends nothing again: still one flow run a few seconds later.
    restarted = S3Watcher(
        s3=moto_s3, engine=launch_settings, bucket=BUCKET, prefix="runs/", emit=prefect_emitter()
    )
    assert restarted.poll_once().emitted == []
    time.sleep(2)
    assert len(_flow_runs(deployment_id)) == 1

    # The event delivered twice (at-least-once bridges): the launch itself is idempotent.
    from flows.launch import launch_run

    first = launch_run(**runs[0].parameters)
    second = launch_run(**runs[0].parameters)
    assert first == second
    with launch_settings.connect() as conn:
        rows = conn.execute(select(Run.id, Run.config_source, Run.idempotency_key)).all()
    assert [tuple(r) for r in rows] == [(first, uri, uri)]
