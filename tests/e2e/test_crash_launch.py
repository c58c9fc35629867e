"""A run an operator aborts while it is still launching stays ``aborted``: the launch enqueues
nothing, leaves no live key, and never tries the illegal ``aborted → failed`` transition."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Row, func, select

from evalfleet.embedded import EmbeddedStack
from flows.launch import launch_run
from ledger.models import ApiKey, InstanceResult, Job, Run
from tasks import controls, keys, launch, ledger_io

pytestmark = [pytest.mark.postgres, pytest.mark.prefect, pytest.mark.slow]


def config(n: int) -> dict[str, Any]:
    return {
        "name": "aborted-while-launching",
        "harness": {"name": "simulated", "options": {"calls_median": 1, "think_s": 0.0}},
        "alias": "sim-openai",
        "instances": [f"inst-{i}" for i in range(n)],
        "caps": {"spend_usd": 1.0},
    }


def _abort(run_id: str) -> None:
    controls.abort("run", run_id, live="finish", actor="test", reason="abort while launching")


def _run(key: str) -> tuple[Row[tuple[str, str, str | None]], list[str], int, set[str]]:
    with ledger_io.engine().connect() as conn:
        run = conn.execute(
            select(Run.id, Run.state, Run.failure_reason).where(Run.idempotency_key == key)
        ).one()
        key_states = sorted(
            conn.execute(select(ApiKey.state).where(ApiKey.run_id == run.id)).scalars()
        )
        jobs = conn.execute(
            select(func.count()).select_from(Job).where(Job.run_id == run.id)
        ).scalar_one()
        instances = set(
            conn.execute(
                select(InstanceResult.state).where(InstanceResult.run_id == run.id)
            ).scalars()
        )
    return run, key_states, jobs, instances


def test_abort_during_key_minting_leaves_the_run_aborted(
    e2e_env: Callable[..., EmbeddedStack], monkeypatch: pytest.MonkeyPatch
) -> None:
    e2e_env()
    mint = keys.mint_keys

    def mint_then_abort(run_id: str, alias: str, spend_cap: int) -> None:
        minted = mint(run_id, alias, spend_cap)
        _abort(run_id)  # the operator's abort lands between minting and enqueuing
        return minted

    monkeypatch.setattr(keys, "mint_keys", mint_then_abort)
    run_id = launch_run(config=config(3), idempotency_key="abort-mint")
    run, key_states, jobs, instances = _run("abort-mint")
    assert run.id == run_id
    assert run.state == "aborted"
    assert run.failure_reason is None
    assert key_states == ["revoked", "revoked"]  # minted after the abort's revoke: revoked too
    assert jobs == 0
    assert instances == {"aborted"}


def test_a_launch_failing_after_an_abort_keeps_the_abort_and_raises_its_error(
    e2e_env: Callable[..., EmbeddedStack], monkeypatch: pytest.MonkeyPatch
) -> None:
    e2e_env()

    def abort_then_fail(run_id: str, instance_ids: tuple[str, ...], launch_order: str) -> bool:
        _abort(run_id)
        raise RuntimeError("queue unavailable")

    monkeypatch.setattr(launch, "enqueue_run", abort_then_fail)
    # the launch's own error surfaces, not an IllegalTransition from aborted → failed
    with pytest.raises(RuntimeError, match="queue unavailable"):
        launch_run(config=config(2), idempotency_key="abort-fail")
    run, key_states, jobs, _ = _run("abort-fail")
    assert run.state == "aborted"
    assert key_states == ["revoked", "revoked"]
    assert jobs == 0


def test_fail_run_fails_a_launching_run_and_leaves_an_ended_one(
    e2e_env: Callable[..., EmbeddedStack],
) -> None:
    e2e_env()
    cfg, _, _ = launch.read_config(config(1), None)
    run_id, created = launch.write_run(cfg, None, "fail-direct")
    assert created
    assert launch.fail_run(run_id, "x" * 5000).value == "failed"
    assert launch.fail_run(run_id, "again").value == "failed"  # idempotent, no transition error
    run, _, _, _ = _run("fail-direct")
    assert run.state == "failed" and run.failure_reason == "x" * launch.MAX_REASON_CHARS
    # enqueuing a run that is no longer launching adds nothing
    assert launch.enqueue_run(run_id, cfg.instances) is False
    assert _run("fail-direct")[2] == 0
