"""Fill a ledger from a SIMULATED run, for the notebooks, their CI run and the tests.

``write_simulated_run`` lands a ``SimulatedRun`` (recorded by ``analysis.simrecord.simulate``:
the simulator's calls, instances, ticks and audit events) in one transaction on a migrated
ledger, as a closed run whose sim time 0 is ``start_at``: one ``llm_calls`` row per attempt,
the ``instance_results`` rows, a ``planner_decisions`` row per planner tick and a
``capacity_snapshots`` row every second tick, the ``audit_log`` rows, and the alias's last
rate-limit headers in ``alias_observations``. ``write_call_frames`` lands ``fit_curve``-format
tables (e.g. ``sim.traces.synthesize_calls``) as a finished run, for checking the refit through
the ledger.

The simulation side (``simulate``, ``SimulatedRun``, ``DEMO_SCENARIO``, ``demo_scenario``) lives
in ``analysis.simrecord`` and is re-exported here, where the notebooks and tests import it.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Engine, insert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from analysis.simrecord import (
    DEMO_SCENARIO,
    PRICE_CACHED,
    PRICE_OUTPUT,
    PRICE_UNCACHED,
    SIM_ACTOR,
    SimulatedRun,
    demo_scenario,
    simulate,
)
from evalfleet.errors import ConfigError
from evalfleet.states import RunState
from ledger.db import is_postgresql, write_transaction
from ledger.models import (
    AliasObservation,
    AuditLog,
    CapacitySnapshot,
    InstanceResult,
    LlmCall,
    PlannerDecision,
    Run,
)
from planner.classify import Classification

__all__ = [
    "DEMO_SCENARIO",
    "PRICE_CACHED",
    "PRICE_OUTPUT",
    "PRICE_UNCACHED",
    "SIM_ACTOR",
    "SNAPSHOT_EVERY_TICKS",
    "SimulatedRun",
    "demo_scenario",
    "instance_id_of",
    "simulate",
    "write_call_frames",
    "write_simulated_run",
]

SNAPSHOT_EVERY_TICKS = 2


def _run_row(
    run_id: str, sim: SimulatedRun, alias: str, start_at: datetime, n: int
) -> dict[str, Any]:
    end_at = start_at + timedelta(seconds=sim.makespan_s)
    return {
        "id": run_id,
        "name": sim.scenario.name[:64],
        "harness": sim.harness,
        "alias": alias,
        "state": RunState.CLOSED.value,
        "task_cap": sim.scenario.caps.run,
        "spend_cap_micro_usd": 1_000_000_000,
        "priority": 1.0,
        "max_attempts": 3,
        "config": {"simulated": True, "policy": sim.policy, "instances": n},
        "config_source": f"simulated:{sim.scenario.name}"[:1024],
        "created_at": start_at,
        "updated_at": end_at,
        "closed_at": end_at,
    }


def instance_id_of(index: int) -> str:
    """The instance id ``write_simulated_run`` gives simulated instance ``index``."""
    return f"sim-{index:05d}"


def write_simulated_run(
    engine: Engine,
    sim: SimulatedRun,
    *,
    start_at: datetime,
    run_id: str | None = None,
    alias: str = "sim-openai",
    pool: str = "harness",
) -> str:
    """Land ``sim`` in the (migrated) ledger as a closed run starting at ``start_at``; returns
    the run id. One transaction: the run is written completely or not at all."""
    if start_at.tzinfo is None:
        raise ConfigError("write_simulated_run", ["start_at: must be timezone-aware"])
    run_id = run_id or str(uuid.uuid4())

    def at(seconds: float) -> datetime:
        return start_at + timedelta(seconds=float(seconds))

    inst = sim.instances
    n = int(inst.shape[0])
    instance_rows = [
        {
            "run_id": run_id,
            "instance_id": instance_id_of(int(r.instance)),
            "state": "resolved" if r.resolved else "unresolved",
            "attempt": 1,
            "started_at": at(r.launched_s),
            "claimed_at": at(r.launched_s),
            "running_at": at(r.started_s),
            "finished_at": at(r.ended_s),
            "input_tokens": int(r.input_tokens),
            "cached_input_tokens": int(r.cached_input_tokens),
            "output_tokens": int(r.output_tokens),
            "calls": int(r.calls),
            "cost_micro_usd": int(r.cost_micro_usd),
            "resolved": bool(r.resolved),
        }
        for r in inst.itertuples(index=False)
    ]
    c = sim.calls
    call_rows = [
        {
            "run_id": run_id,
            "instance_id": instance_id_of(int(r.instance)),
            "alias": alias,
            "harness": sim.harness,
            "requested_at": at(r.requested_s),
            "sent_at": at(r.requested_s + r.pacer_wait_s),
            "task_age_s": float(r.task_age_s),
            "input_tokens": int(r.input_tokens),
            "cached_input_tokens": int(r.cached_input_tokens),
            "output_tokens": int(r.output_tokens),
            "latency_s": float(r.latency_s),
            "pacer_wait_s": float(r.pacer_wait_s),
            "status": int(r.status),
            "limit_type": r.limit_type if isinstance(r.limit_type, str) else None,
            "cost_micro_usd": int(r.cost_micro_usd),
        }
        for r in c.itertuples(index=False)
    ]
    decision_rows = [
        {"alias": alias, "tick_at": at(t["t"]), **t["decision"]}
        for t in sim.ticks.to_dict("records")
        if isinstance(t.get("decision"), dict)
    ]
    snapshot_rows = [
        {
            "pool": pool,
            "taken_at": at(t["t"]),
            "running": int(t["running"]),
            "booting": int(t["booting"]),
            "queued": int(t["queued"]),
            "paused": False,
            "ceiling": int(t["ceiling"]),
        }
        for i, t in enumerate(sim.ticks.to_dict("records"))
        if i % SNAPSHOT_EVERY_TICKS == 0
    ]
    audit_rows = [
        {
            "at": at(a["t"]),
            "actor": a["actor"],
            "action": a["action"],
            "target": f"run:{run_id}" if a["action"].startswith("run.") else f"alias:{alias}",
            "reason": a["reason"],
            "old": None,
            "new": a.get("new"),
        }
        for a in sim.audit
    ]
    with write_transaction(engine) as conn:
        conn.execute(insert(Run).values(**_run_row(run_id, sim, alias, start_at, n)))
        _insert_many(conn, InstanceResult, instance_rows)
        _insert_many(conn, LlmCall, call_rows)
        _insert_many(conn, PlannerDecision, decision_rows)
        _insert_many(conn, CapacitySnapshot, snapshot_rows)
        _insert_many(conn, AuditLog, audit_rows)
        if sim.final_headers is not None:
            _upsert_observation(conn, alias, at(sim.makespan_s), sim.final_headers)
    return run_id


def _insert_many(conn: Any, table: Any, rows: Sequence[dict[str, Any]], chunk: int = 5000) -> None:
    for i in range(0, len(rows), chunk):
        conn.execute(insert(table), list(rows[i : i + chunk]))


def _upsert_observation(conn: Any, alias: str, when: datetime, view: Classification) -> None:
    values = {
        "alias": alias,
        "observed_at": when,
        "status": 200,
        "headers": {},
        "limits": {
            "limits": {str(k): v for k, v in view.limits.items()},
            "remaining": {str(k): v for k, v in view.remaining.items()},
        },
        "last_limit_type": None,
        "last_limited_at": None,
    }
    dialect_insert = pg_insert if is_postgresql(conn) else sqlite_insert
    stmt = dialect_insert(AliasObservation).values(**values)
    stmt = stmt.on_conflict_do_update(
        index_elements=["alias"], set_={k: v for k, v in values.items() if k != "alias"}
    )
    conn.execute(stmt)


def write_call_frames(
    engine: Engine,
    calls: pd.DataFrame,
    instances: pd.DataFrame,
    *,
    harness: str,
    start_at: datetime,
    stagger_s: float = 5.0,
    alias: str = "sim-openai",
    run_id: str | None = None,
) -> str:
    """Land ``fit_curve`` tables (calls: instance_id, t_request_s, token columns; instances:
    instance_id, wall_time_s) as one closed run: instance ``k`` starts ``k * stagger_s`` after
    ``start_at``; each call becomes a 200 ``llm_calls`` row with ``task_age_s = t_request_s``.
    Returns the run id."""
    missing = [
        col
        for col in ("instance_id", "t_request_s", "input_tokens", "cached_input_tokens")
        if col not in calls.columns
    ] + [col for col in ("instance_id", "wall_time_s") if col not in instances.columns]
    if missing:
        raise ConfigError("write_call_frames", [f"missing columns: {', '.join(missing)}"])
    if start_at.tzinfo is None:
        raise ConfigError("write_call_frames", ["start_at: must be timezone-aware"])
    run_id = run_id or str(uuid.uuid4())
    ids = instances["instance_id"].astype(str).tolist()
    offset = {i: k * stagger_s for k, i in enumerate(ids)}
    wall = dict(zip(ids, instances["wall_time_s"].astype(float), strict=True))
    age = np.maximum(calls["t_request_s"].to_numpy(dtype=np.float64), 0.0)
    call_ids = calls["instance_id"].astype(str).to_numpy()
    unknown = sorted(set(call_ids) - set(ids))
    if unknown:
        raise ConfigError("write_call_frames", [f"calls of unknown instance {unknown[0]!r}"])
    call_rows = [
        {
            "run_id": run_id,
            "instance_id": i,
            "alias": alias,
            "harness": harness,
            "requested_at": start_at + timedelta(seconds=offset[i] + a),
            "task_age_s": float(a),
            "input_tokens": int(tin),
            "cached_input_tokens": int(tc),
            "output_tokens": int(tout),
            "latency_s": 1.0,
            "status": 200,
        }
        for i, a, tin, tc, tout in zip(
            call_ids,
            age,
            calls["input_tokens"],
            calls["cached_input_tokens"],
            calls["output_tokens"],
            strict=True,
        )
    ]
    instance_rows = [
        {
            "run_id": run_id,
            "instance_id": i,
            "state": "resolved",
            "attempt": 1,
            "started_at": start_at + timedelta(seconds=offset[i]),
            "finished_at": start_at + timedelta(seconds=offset[i] + wall[i]),
        }
        for i in ids
    ]
    end = max(offset[i] + wall[i] for i in ids) if ids else 0.0
    digest = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    with write_transaction(engine) as conn:
        conn.execute(
            insert(Run).values(
                id=run_id,
                name=f"synthetic-{digest}",
                harness=harness,
                alias=alias,
                state=RunState.CLOSED.value,
                spend_cap_micro_usd=1_000_000_000,
                max_attempts=3,
                config={"synthetic": True},
                created_at=start_at,
                updated_at=start_at + timedelta(seconds=end),
                closed_at=start_at + timedelta(seconds=end),
            )
        )
        _insert_many(conn, InstanceResult, instance_rows)
        _insert_many(conn, LlmCall, call_rows)
    return run_id
