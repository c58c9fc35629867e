"""Planner-loop tasks: read each alias's fleet and budgets, decide, record the decision.

Per alias with claimable runs (one tick): the running tasks' ages (from ``started_at``; the
clock is read here, in the task, and passed to the pure planner), booting and queued counts,
whether the harness pool (ledger flag or the Prefect work pool) or every run is paused, the
caps, and the budgets (the alias's ``pacer_configs`` row, else its configured seed). The pure
``planner.sizing.decide`` turns that into a ``Decision``; one ``planner_decisions`` row per alias
is written. The curve is the shipped default curve of the harness (``planner.curves``).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
from sqlalchemy import func, insert, select

from evalfleet.settings import get_settings
from evalfleet.states import RUN_CLAIMABLE
from gateway.aliases import load_aliases
from ledger.models import InstanceResult, Job, PacerConfig, PauseFlag, PlannerDecision, Run
from planner.curves import HarnessCurve, default_curve
from planner.decision import Decision
from planner.sizing import Caps, Counting, FleetState, SizingConfig, decide
from tasks.ledger_io import engine

STALE_AFTER = timedelta(hours=6)
_CLAIMABLE = tuple(s.value for s in RUN_CLAIMABLE)


@dataclass(frozen=True)
class Budgets:
    calls_per_s: float
    tokens_per_s: float
    output_tokens_per_s: float | None
    inflight_tokens: float
    cached_input_counts: bool
    stale: bool


@functools.cache
def _curve() -> HarnessCurve:
    return default_curve()


def budgets_for(alias: str, now: datetime) -> Budgets:
    """The alias's current pacer budgets (ledger row, else the configured seed)."""
    with engine().connect() as conn:
        row = conn.execute(
            select(PacerConfig).where(PacerConfig.alias == alias)
        ).scalar_one_or_none()
    if row is not None:
        seeded = row.seeded_at if row.seeded_at.tzinfo else row.seeded_at.replace(tzinfo=UTC)
        return Budgets(
            row.calls_per_s,
            row.tokens_per_s,
            row.output_tokens_per_s,
            row.inflight_tokens,
            row.cached_input_counts,
            stale=now - seeded > STALE_AFTER,
        )
    s = get_settings()
    seed = load_aliases(s.aliases_file, provider_sim_url=s.provider_sim_url).get(alias)
    return Budgets(
        seed.pacer.calls_per_s,
        seed.pacer.tokens_per_s,
        seed.pacer.output_tokens_per_s,
        seed.pacer.inflight_tokens,
        seed.cached_input_counts,
        stale=False,
    )


def prefect_pool_paused(pool: str) -> bool:
    """Whether the Prefect work pool is paused (the UI's pause is honoured like the ledger's)."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return bool(client.read_work_pool(pool).is_paused)
        except ObjectNotFound:
            return False


def plan_tick(now: datetime, prefect_paused: bool) -> dict[str, Decision]:
    """Decide every alias with claimable runs; write one planner_decisions row each."""
    settings = get_settings()
    decisions: dict[str, Decision] = {}
    with engine().connect() as conn:
        runs = conn.execute(
            select(Run.id, Run.alias, Run.task_cap, Run.ceiling_override).where(
                Run.state.in_(_CLAIMABLE)
            )
        ).all()
        paused_flags = {
            (scope, target)
            for scope, target in conn.execute(
                select(PauseFlag.scope, PauseFlag.target).where(PauseFlag.paused.is_(True))
            ).all()
        }
        started = conn.execute(
            select(InstanceResult.run_id, InstanceResult.state, InstanceResult.started_at).where(
                InstanceResult.state.in_(("booting", "running", "evaluating"))
            )
        ).all()
        queued = {
            r: int(n)
            for r, n in conn.execute(
                select(Job.run_id, func.count())
                .where(Job.pool == "harness", Job.lease_token.is_(None))
                .group_by(Job.run_id)
            ).all()
        }
    pool_paused = prefect_paused or ("pool", "harness") in paused_flags
    for alias in sorted({r.alias for r in runs}):
        on_alias = [r for r in runs if r.alias == alias]
        ids = {r.id for r in on_alias}
        ages = np.array(
            [
                max(0.0, (now - _utc(t)).total_seconds())
                for run_id, state, t in started
                if run_id in ids and state != "booting" and t is not None
            ],
            dtype=np.float64,
        )
        booting = sum(1 for run_id, state, _ in started if run_id in ids and state == "booting")
        all_paused = all(("run", r.id) in paused_flags for r in on_alias)
        budgets = budgets_for(alias, now)
        fleet = FleetState(
            now=now.timestamp(),
            ages=ages,
            booting=booting,
            queued=sum(queued.get(i, 0) for i in ids),
            paused=pool_paused or all_paused,
            stale=budgets.stale,
        )
        caps = Caps(
            static=settings.static_cap,
            run=_sum_or_none([r.task_cap for r in on_alias]),
            override=_sum_or_none([r.ceiling_override for r in on_alias]),
        )
        decision = decide(
            fleet, _curve(), budgets, Counting(budgets.cached_input_counts), caps, SizingConfig()
        )
        decisions[alias] = decision
    if decisions:
        with engine().begin() as conn:
            conn.execute(
                insert(PlannerDecision),
                [{"alias": a, "tick_at": now, **d.as_row()} for a, d in decisions.items()],
            )
    return decisions


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _sum_or_none(values: list[int | None]) -> int | None:
    """The caps of all runs on an alias add up; one uncapped run leaves the alias uncapped."""
    if any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


def decision_table(decisions: dict[str, Decision]) -> list[dict[str, Any]]:
    """Rows of the planner's Prefect table artifact."""
    return [
        {
            "alias": alias,
            "ceiling": d.ceiling,
            "live": d.live,
            "booting": d.booting,
            "queued": d.queued,
            "launches_allowed": d.launches_allowed,
            "binding": d.binding.value,
        }
        for alias, d in sorted(decisions.items())
    ]
