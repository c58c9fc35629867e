"""A whole run on the embedded stack: launch-run → dispatcher (in-process launcher) → instances
through the real gateway and simulated provider → supervisor closes the run and revokes keys."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select

from evalfleet.embedded import EmbeddedStack
from evalfleet.errors import ConfigError, KeyManagementError
from flows.dispatch import dispatcher_loop
from flows.launch import launch_run
from flows.supervisor import supervise_once
from ledger.models import ApiKey, InstanceResult, Job, LlmCall, Run
from tasks import ledger_io
from tasks.keys import load_gateway_key

pytestmark = [pytest.mark.postgres, pytest.mark.prefect, pytest.mark.slow]


def config(n: int, **over: object) -> dict[str, Any]:
    return {
        "name": "e2e",
        "harness": {
            "name": "simulated",
            "options": {
                "calls_median": 3,
                "calls_sigma": 0.0,
                "think_s": 0.05,
                "token_scale": 0.05,
            },
        },
        "evaluator": {"name": "simulated", "options": {"duration_s": 0.0, "resolve_rate": 0.5}},
        "alias": "sim-openai",
        "instances": [f"inst-{i}" for i in range(n)],
        "caps": {"spend_usd": 5.0},
        **over,
    }


def test_a_run_lands_every_instance_once_and_closes_with_keys_revoked(
    e2e_env: Callable[..., EmbeddedStack],
) -> None:
    e2e_env()
    run_id = launch_run(config=config(6), idempotency_key="e2e-1")
    assert launch_run(config=config(6), idempotency_key="e2e-1") == run_id  # idempotent
    engine = ledger_io.engine()
    with engine.connect() as conn:
        assert conn.execute(select(Run.state).where(Run.id == run_id)).scalar_one() == "running"
        assert conn.execute(select(func.count()).select_from(Job)).scalar_one() == 6
    assert dispatcher_loop(launcher="in-process", until_idle=True, max_passes=600) == 6
    supervise_once(scale_eval_pool=False)
    with engine.connect() as conn:
        rows = conn.execute(
            select(InstanceResult.state, InstanceResult.calls, InstanceResult.cost_micro_usd).where(
                InstanceResult.run_id == run_id
            )
        ).all()
        assert len(rows) == 6
        assert {state for state, _, _ in rows} <= {"resolved", "unresolved"}
        assert all(calls == 3 for _, calls, _ in rows)
        # the gateway records calls in batches: the cost of each instance is in llm_calls
        costs = dict(
            conn.execute(
                select(LlmCall.instance_id, func.sum(LlmCall.cost_micro_usd))
                .where(LlmCall.run_id == run_id)
                .group_by(LlmCall.instance_id)
            )
            .tuples()
            .all()
        )
        assert len(costs) == 6 and all(c > 0 for c in costs.values())
        assert conn.execute(select(func.count()).select_from(Job)).scalar_one() == 0
        calls = conn.execute(
            select(func.count()).where(LlmCall.run_id == run_id, LlmCall.status == 200)
        ).scalar_one()
        assert calls == 18
        assert conn.execute(select(Run.state).where(Run.id == run_id)).scalar_one() == "closed"
        states = conn.execute(
            select(ApiKey.kind, ApiKey.state).where(ApiKey.run_id == run_id)
        ).all()
    assert sorted(states) == [("gateway", "revoked"), ("provider", "revoked")]
    with pytest.raises(KeyManagementError):
        load_gateway_key(run_id)


def test_a_launch_that_fails_half_way_leaves_no_live_key(
    e2e_env: Callable[..., EmbeddedStack], monkeypatch: pytest.MonkeyPatch
) -> None:
    e2e_env()
    from tasks import launch

    def broken(run_id: str, instance_ids: tuple[str, ...], launch_order: str) -> bool:
        raise RuntimeError("queue unavailable")

    monkeypatch.setattr(launch, "enqueue_run", broken)
    with pytest.raises(RuntimeError, match="queue unavailable"):
        launch_run(config=config(2), idempotency_key="e2e-fail")
    with ledger_io.engine().connect() as conn:
        run = conn.execute(
            select(Run.id, Run.state, Run.failure_reason).where(Run.idempotency_key == "e2e-fail")
        ).one()
        assert run.state == "failed"
        assert "queue unavailable" in run.failure_reason
        keys = conn.execute(select(ApiKey.state).where(ApiKey.run_id == run.id)).scalars().all()
    assert sorted(keys) == ["revoked", "revoked"]


def test_a_bad_config_writes_nothing(e2e_env: Callable[..., EmbeddedStack]) -> None:
    with pytest.raises(ConfigError, match="think_s"):
        launch_run(config=config(2, harness={"name": "simulated", "options": {"think_s": -1}}))
    with ledger_io.engine().connect() as conn:
        assert conn.execute(select(func.count()).select_from(Run)).scalar_one() == 0


def test_an_attempt_past_its_instance_timeout_lands_as_error_and_is_not_retried(
    e2e_env: Callable[..., EmbeddedStack],
) -> None:
    e2e_env()
    slow = config(2, timeouts={"instance_s": 1.0})
    # 40 steps with 0.2 s of tool time each: ~8 s unbounded, stopped after ~1 s
    slow["harness"]["options"].update(calls_median=40, think_s=0.2)
    run_id = launch_run(config=slow, idempotency_key="e2e-timeout")
    assert dispatcher_loop(launcher="in-process", until_idle=True, max_passes=600) == 2
    supervise_once(scale_eval_pool=False)
    engine = ledger_io.engine()
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                InstanceResult.state,
                InstanceResult.attempt,
                InstanceResult.error_class,
                InstanceResult.error_detail,
            ).where(InstanceResult.run_id == run_id)
        ).all()
        assert conn.execute(select(func.count()).select_from(Job)).scalar_one() == 0
        assert conn.execute(select(Run.state).where(Run.id == run_id)).scalar_one() == "closed"
    assert len(rows) == 2
    for state, attempts, error_class, detail in rows:
        assert (state, attempts, error_class) == ("error", 1, "instance_timeout")
        assert "timeouts.instance_s = 1 s" in detail
