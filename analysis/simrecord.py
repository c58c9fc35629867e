"""Record a SIMULATED run: what the gateway, the planner loop and the supervisor would have seen.

``simulate`` runs the discrete-event simulator (``sim.engine.Simulation``) on a scenario under a
policy (the planner by default) without touching the simulator: the policy (and its pacer gate)
is wrapped by ``_Recorder``, which sees every tick, every pacer offer and every provider answer
(call index → instance through the workload). From those it builds a ``SimulatedRun`` of plain
tables in simulated seconds:

- one row per call attempt: requested when offered to the pacer (or sent, without a pacer),
  ``pacer_wait_s`` until sent, ``task_age_s`` from the instance's start (its first request),
  tokens and cost on a 200, ``status`` 429 and the classified ``limit_type`` otherwise;
- per instance: launch (start minus its boot time: the claim), start, end (last response plus
  the tool time after it), tokens, calls, cost, and a resolved/unresolved outcome drawn
  deterministically (share ``resolved_share``);
- per planner tick: fleet counts, the ceiling and (for the planner) its ``Decision``;
- the audit events: the run's launch and close, and every provider limit change of the scenario;
- the provider's rate-limit headers at the end.

Landing these in a ledger is ``analysis.simfill``'s job; this module knows nothing of SQL.
Prices are fixed simulated ones. ``DEMO_SCENARIO`` is the small scenario of the notebooks and CI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from evalfleet.errors import ConfigError
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
