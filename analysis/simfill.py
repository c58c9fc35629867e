"""Fill a ledger from a SIMULATED run, for the notebooks, their CI run and the tests.

``simulate`` runs the discrete-event simulator (``sim.engine.Simulation``) on a scenario under a
policy (the planner by default) and records what the gateway, the planner loop and the supervisor
would have written, without touching the simulator: the policy (and its pacer gate) is wrapped
by ``_Recorder``, which sees every tick, every pacer offer and every provider answer (call index
→ instance through the workload). From those:

- one ``llm_calls`` row per attempt: requested when offered to the pacer (or sent, without a
  pacer), ``pacer_wait_s`` until sent, ``task_age_s`` from the instance's start (its first
  request), tokens and cost on a 200, ``status`` 429 and the classified ``limit_type`` otherwise;
- per instance: launch (start minus its boot time: the claim, ``started_at``), start, end (last
  response plus the tool time after it), tokens, calls, cost, and a resolved/unresolved outcome
  drawn deterministically (share ``resolved_share``);
- per planner tick: a ``planner_decisions`` row (the planner policy's ``Decision``), and every
  second tick a ``capacity_snapshots`` row (running, booting, queued, ceiling);
- ``audit_log``: the run's launch and close, and every provider limit change of the scenario.

``write_simulated_run`` lands it all (plus the alias's last rate-limit headers in
``alias_observations``) in one transaction on a migrated ledger: sim time 0 is ``start_at``.
``write_call_frames`` lands ``fit_curve``-format tables (e.g. ``sim.traces.synthesize_calls``)
as a finished run, for checking the refit through the ledger. Prices are fixed simulated ones.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Engine, insert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

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
from sim.engine import FleetView, Gate, Policy, Simulation
from sim.limits import ProviderLimits
from sim.metrics import limit_spec
from sim.reveal import headers_now
from sim.scenario import Scenario, parse_scenario
from sim.traces import TRACE_HARNESS
from sim.workload import Workload, build_workload

# Simulated prices, micro-dollars per token (a frontier model's order of magnitude).
PRICE_UNCACHED = 1.25
PRICE_CACHED = 0.125
PRICE_OUTPUT = 10.0
SNAPSHOT_EVERY_TICKS = 2
SIM_ACTOR = "simfill"

#: A small scenario for the notebooks and CI: 80 instances of the shipped trace against an
#: OpenAI-style provider whose headers state requests and tokens but not its output-token limit,
#: and whose input limit halves at 10 minutes, so the planner meets typed 429s and cools down
#: (which limit it meets depends on the planner's tuning). A few thousand calls over about an
#: hour of simulated time, ~1 s to simulate.
DEMO_SCENARIO: dict[str, Any] = {
    "name": "notebook-demo",
    "description": "80 trace instances; hidden output-token limit; input limit halves at 10 min",
    "seed": 3,
    "instances": 80,
    "harness": {
        "trace": "minisweagent-gemini3pro-verified",
        "boot_s": {"min": 20, "max": 60},
    },
    "provider": {
        "rpm": 400,
        "input_tpm": 400_000,
        "output_tpm": 25_000,
        "headers": "openai",
        "changes": [{"at_s": 600, "input_tpm": 200_000}],
    },
    "alias_config": {
        "calls_per_s": 10,
        "tokens_per_s": 8000,
        "output_tokens_per_s": 1500,
        "inflight_tokens": 1_000_000,
    },
    "caps": {"static": 60},
}


def demo_scenario(instances: int | None = None) -> Scenario:
    """``DEMO_SCENARIO`` (optionally with another instance count), validated."""
    data = dict(DEMO_SCENARIO)
    if instances is not None:
        data["instances"] = instances
    return parse_scenario(data, "demo scenario")


@dataclass
class SimulatedRun:
    """Everything a simulated run leaves behind, in simulated seconds (see module docstring)."""

    scenario: Scenario
    harness: str
    policy: str
    makespan_s: float
    calls: pd.DataFrame
    instances: pd.DataFrame
    ticks: pd.DataFrame
    final_headers: Classification | None
    audit: list[dict[str, Any]] = field(default_factory=list)


class _RecordingGate:
    """The inner pacer gate, noting when each call attempt was offered."""

    def __init__(self, inner: Gate, offered: dict[int, float]) -> None:
        self.inner = inner
        self.offered = offered

    def offer(self, now: float, call: int) -> bool:
        self.offered[call] = now
        return self.inner.offer(now, call)

    def release(self, now: float, call: int, ok: bool) -> None:
        self.inner.release(now, call, ok)

    def admit_ready(self, now: float) -> list[int]:
        return self.inner.admit_ready(now)

    def next_time(self, now: float) -> float | None:
        return self.inner.next_time(now)

    @property
    def waiting(self) -> int:
        return self.inner.waiting

    def __getattr__(self, name: str) -> Any:
        # Anything else the engine asks of its gate is the inner gate's business.
        return getattr(self.inner, name)


class _Recorder:
    """A policy that delegates to ``inner`` and records attempts, answers and ticks."""

    def __init__(self, inner: Policy, workload: Workload) -> None:
        self.inner = inner
        self.name = inner.name
        # The gateway classifies every 429 whatever the policy: ask the engine for the rendered
        # classification always (baselines that ignore it only look at whether it is None).
        self.reads_headers = True
        self.offered: dict[int, float] = {}
        self.gate: Gate | None = (
            _RecordingGate(inner.gate, self.offered) if inner.gate is not None else None
        )
        self.latency = workload.latency
        # attempt rows: call, requested, sent, status, limit type
        self.attempts: list[tuple[int, float, float, int, str | None]] = []
        self.responded: dict[int, float] = {}
        self.ticks: list[dict[str, Any]] = []

    def tick(self, fleet: FleetView) -> int:
        ceiling = self.inner.tick(fleet)
        row: dict[str, Any] = {
            "t": fleet.now,
            "running": int(fleet.ages.size),
            "booting": fleet.booting,
            "queued": fleet.queued,
            "ceiling": ceiling,
        }
        decisions = getattr(self.inner, "decisions", None)
        if decisions:
            row["decision"] = decisions[-1].as_row()
        self.ticks.append(row)
        return ceiling

    def on_response(self, now: float, call: int, classification: Classification | None) -> None:
        if classification is None:
            sent = now - float(self.latency[call])
            requested = self.offered.pop(call, sent)
            self.attempts.append((call, requested, sent, 200, None))
            self.responded[call] = now
        else:
            requested = self.offered.pop(call, now)
            limit = classification.limit_type.value
            self.attempts.append((call, requested, now, classification.status, limit))
        self.inner.on_response(now, call, classification)


def _harness_of(scenario: Scenario) -> str:
    trace = scenario.harness.trace
    if trace is not None:
        return TRACE_HARNESS.get(trace, trace)
    return f"parametric:{scenario.name}"


def simulate(
    scenario: Scenario, policy: str = "planner", *, resolved_share: float = 0.7
) -> SimulatedRun:
    """Simulate ``scenario`` under ``policy`` and collect the run's records (see module doc)."""
    from sim.bench import make_policy

    if not 0.0 <= resolved_share <= 1.0:
        raise ConfigError("simulate", [f"resolved_share: must be in [0, 1], got {resolved_share}"])
    workload = build_workload(scenario)
    spec, changes = limit_spec(scenario)
    provider = ProviderLimits(spec, changes)
    recorder = _Recorder(make_policy(policy, scenario, workload, provider), workload)
    style = scenario.provider.headers
    stats = Simulation(workload, recorder, provider, style).run()
    if not np.isfinite(stats.makespan_s):
        raise ConfigError(scenario.name, [f"policy {policy}: the simulation did not finish"])

    n = workload.n_instances
    call_instance = np.repeat(np.arange(n), np.diff(workload.start))
    att = pd.DataFrame(recorder.attempts, columns=["call", "requested", "sent", "status", "limit"])
    att["instance"] = call_instance[att["call"].to_numpy()]
    first_call = workload.start[:-1]
    first_offer = att[att["call"].isin(first_call)].groupby("instance")["requested"].min()
    start = first_offer.reindex(np.arange(n)).to_numpy(dtype=np.float64)
    last_call = workload.start[1:] - 1
    last_response = np.array([recorder.responded.get(int(c), np.nan) for c in last_call])
    end = last_response + workload.after[last_call]
    if np.isnan(start).any() or np.isnan(end).any():
        raise ConfigError(scenario.name, ["an instance without calls cannot be recorded"])

    ok = att["status"].to_numpy() == 200
    c = att["call"].to_numpy()
    uncached = np.where(ok, workload.input[c] - workload.cached[c], 0)
    cached = np.where(ok, workload.cached[c], 0)
    output = np.where(ok, workload.output[c], 0)
    calls = pd.DataFrame(
        {
            "instance": att["instance"].to_numpy(),
            "requested_s": att["requested"].to_numpy(),
            "task_age_s": att["requested"].to_numpy() - start[att["instance"].to_numpy()],
            "input_tokens": uncached + cached,
            "cached_input_tokens": cached,
            "output_tokens": output,
            "latency_s": np.where(ok, workload.latency[c], 0.0),
            "pacer_wait_s": att["sent"].to_numpy() - att["requested"].to_numpy(),
            "status": att["status"].to_numpy(),
            "limit_type": att["limit"].to_numpy(),
            "cost_micro_usd": np.rint(
                uncached * PRICE_UNCACHED + cached * PRICE_CACHED + output * PRICE_OUTPUT
            ).astype(np.int64),
        }
    ).sort_values("requested_s", kind="stable", ignore_index=True)

    ok_calls = calls[calls["status"] == 200].groupby("instance")
    sums = ok_calls[
        ["input_tokens", "cached_input_tokens", "output_tokens", "cost_micro_usd"]
    ].sum()
    sums = sums.reindex(np.arange(n), fill_value=0)
    rng = np.random.default_rng([scenario.seed, 7])
    instances = pd.DataFrame(
        {
            "instance": np.arange(n),
            "launched_s": start - workload.boot,
            "started_s": start,
            "ended_s": end,
            "calls": ok_calls.size().reindex(np.arange(n), fill_value=0).to_numpy(),
            "resolved": rng.uniform(size=n) < resolved_share,
            **{col: sums[col].to_numpy() for col in sums.columns},
        }
    )
    audit = [
        {"t": 0.0, "actor": SIM_ACTOR, "action": "run.launch", "reason": "simulated run started"}
    ]
    for change in scenario.provider.changes:
        new = {k: v for k, v in change.model_dump().items() if k != "at_s" and v is not None}
        audit.append(
            {
                "t": change.at_s,
                "actor": "simulator",
                "action": "provider.limit_change",
                "reason": "the simulated provider changed its limits",
                "new": new,
            }
        )
    audit.append(
        {
            "t": stats.makespan_s,
            "actor": SIM_ACTOR,
            "action": "run.close",
            "reason": "all instances landed",
        }
    )
    return SimulatedRun(
        scenario=scenario,
        harness=_harness_of(scenario),
        policy=policy,
        makespan_s=stats.makespan_s,
        calls=calls,
        instances=instances,
        ticks=pd.DataFrame(recorder.ticks),
        final_headers=headers_now(style, provider, stats.makespan_s),
        audit=audit,
    )


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
