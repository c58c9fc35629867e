"""Planner-loop tasks: per alias, read the fleet, advance the budget controller, decide, record,
and push the budgets to the pacer's Prefect limits. Each function here is one side effect (or a
read); ``flows/planner_loop.py`` sequences them once per tick, and ``plan_tick`` runs the ledger
part of a tick in one call (tests, embedded callers).

One tick, per alias with claimable runs (the clock is read by the flow and passed in):

1. ``read_fleet`` — the running tasks' ages (from their harness's start; booting ones counted
   apart, as age-0 candidates), queued jobs, the harnesses of the alias's work, pauses (the
   harness pool's ledger flag or the Prefect work pool's pause, every run paused), caps: the
   static cap, the runs' task caps, the runs' ceiling overrides and the alias's own override
   (``alias_controls``), and the shortest instance timeout of its runs (``runs.instance_timeout_s``).
2. ``advance_budgets`` (``tasks/plan_budgets.py``) — the controller (``planner.budgets``): its
   state is loaded from ``pacer_states`` (or seeded from the ``pacer_configs`` row, else the
   alias file's seed; an operator edit — a new ``pacer_configs`` version — re-seeds it),
   stepped with what the gateway recorded since the previous tick (429s by limit type,
   overloads, spend errors, utilisation, headers observed since the last tick), and saved; with
   it the saturation controller's overdrive multiplier (``planner.sizing.hold_overdrive``, fed
   the window's use of the budget the previous decision saturated).
3. ``pause_for_spend`` — a spend or billing error pauses the runs it hit (ledger flag + audit).
4. ``decide_all`` — ``planner.sizing.decide`` with the newest curve of the alias's harness
   (``ledger.curves.CurveCache``: a version written between two ticks is used at the next; a
   harness with no curve of its own uses the default harness's) or, when runs of several
   harnesses share the alias, their mix weighted by live + queued tasks (``MixedCurve``), the
   controller's budgets, its cooldown and stale flags, the fleet's progress, the instance
   timeout and the sizing's overdrive times the saturation controller's multiplier.
5. ``record_decisions`` — one ``planner_decisions`` row per alias (with the saturating budget).
6. ``push_pacer_limits`` — the budgets to the alias's Prefect global concurrency limits
   (``gateway.pacer_prefect.push_budgets``), which the gateway's Prefect pacer follows, and
   the queue order the decision names (``Decision.old_tasks_first``, a Prefect variable).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import func, insert, select
from sqlalchemy.orm import Session

from evalfleet.settings import get_settings
from evalfleet.states import INSTANCE_CALLING, RUN_CLAIMABLE
from ledger.clock import as_utc
from ledger.controls import alias_ceiling_overrides
from ledger.models import InstanceResult, Job, PauseFlag, PlannerDecision, Run
from ledger.pauses import set_pause
from planner.budgets import Budgets
from planner.curves import HarnessCurve
from planner.decision import Decision
from planner.sizing import Caps, Counting, Curve, FleetState, FloatArray, decide
from tasks.ledger_io import engine
from tasks.plan_budgets import (
    BudgetStep,
    advance_budgets,
    aliases,
    curve_cache,
    curve_for,
    sizing_config,
)

if TYPE_CHECKING:
    from gateway.aliases import Alias

__all__ = [
    "AliasFleet",
    "BudgetStep",
    "MixedCurve",
    "advance_budgets",
    "aliases",
    "curve_cache",
    "curve_for",
    "decide_all",
    "decision_table",
    "pause_for_spend",
    "plan_tick",
    "prefect_pool_paused",
    "push_pacer_limits",
    "read_fleet",
    "record_decisions",
]

log = logging.getLogger(__name__)

_CLAIMABLE = tuple(s.value for s in RUN_CLAIMABLE)
_LIVE = tuple(s.value for s in INSTANCE_CALLING)  # an evaluating task calls no LLM
PLANNER_ACTOR = "planner"


@dataclass(frozen=True)
class AliasFleet:
    """What the planner sees of one alias's fleet at a tick."""

    alias: str
    harness: str  # the harness of most of the alias's work
    run_ids: tuple[str, ...]
    ages: NDArray[np.float64]
    booting: int
    queued: int
    paused: bool
    caps: Caps
    work: tuple[tuple[str, int], ...] = ()  # (harness, live + queued tasks) on the alias
    instance_timeout_s: float | None = None  # the shortest of its runs' timeouts.instance_s


def prefect_pool_paused(pool: str) -> bool:
    """Whether the Prefect work pool is paused (the UI's pause is honoured like the ledger's)."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return bool(client.read_work_pool(pool).is_paused)
        except ObjectNotFound:
            return False


# ---------------------------------------------------------------------------------------------
# 1. the fleet


def read_fleet(now: datetime, prefect_paused: bool) -> list[AliasFleet]:
    """Every alias with claimable runs, as the planner sees it at ``now``."""
    settings = get_settings()
    with engine().connect() as conn:
        runs = conn.execute(
            select(
                Run.id,
                Run.alias,
                Run.harness,
                Run.task_cap,
                Run.ceiling_override,
                Run.instance_timeout_s,
            ).where(Run.state.in_(_CLAIMABLE))
        ).all()
        flags = {
            (scope, target)
            for scope, target in conn.execute(
                select(PauseFlag.scope, PauseFlag.target).where(PauseFlag.paused.is_(True))
            ).all()
        }
        live = conn.execute(
            select(
                InstanceResult.run_id,
                InstanceResult.state,
                # a running task's age is its harness's (the curves' age); rows from before
                # that was recorded: the instance's first claim, as then
                func.coalesce(InstanceResult.running_at, InstanceResult.started_at),
            ).where(InstanceResult.state.in_(_LIVE))
        ).all()
        queued = {
            r: int(n)
            for r, n in conn.execute(
                select(Job.run_id, func.count())
                .where(Job.pool == "harness", Job.lease_token.is_(None))
                .group_by(Job.run_id)
            ).all()
        }
        with Session(bind=conn) as session:
            alias_overrides = alias_ceiling_overrides(session)
    pool_paused = prefect_paused or ("pool", "harness") in flags
    fleets = []
    for alias in sorted({r.alias for r in runs}):
        on_alias = [r for r in runs if r.alias == alias]
        ids = {r.id for r in on_alias}
        mine = [(s, t) for run_id, s, t in live if run_id in ids]
        ages = np.array(
            [
                max(0.0, (now - as_utc(t)).total_seconds())
                for s, t in mine
                if s != "booting" and t is not None
            ],
            dtype=np.float64,
        )
        # a started task without a start time is as fresh as a booting one
        booting = sum(1 for s, t in mine if s == "booting" or t is None)
        work = Counter[str]()
        for r in on_alias:
            work[r.harness] += queued.get(r.id, 0) + sum(1 for run_id, *_ in live if run_id == r.id)
        harness = max(sorted(work), key=lambda h: work[h])
        run_override = _sum_or_none([r.ceiling_override for r in on_alias])
        override = _min_or_none(run_override, alias_overrides.get(alias))
        fleets.append(
            AliasFleet(
                alias=alias,
                harness=harness,
                work=tuple(sorted(work.items())),
                run_ids=tuple(sorted(ids)),
                ages=ages,
                booting=booting,
                queued=sum(queued.get(i, 0) for i in ids),
                paused=pool_paused or all(("run", i) in flags for i in ids),
                caps=Caps(
                    static=settings.static_cap,
                    run=_sum_or_none([r.task_cap for r in on_alias]),
                    override=override,
                ),
                instance_timeout_s=min(
                    (r.instance_timeout_s for r in on_alias if r.instance_timeout_s is not None),
                    default=None,
                ),
            )
        )
    return fleets


def _sum_or_none(values: list[int | None]) -> int | None:
    """The caps of all runs on an alias add up; one uncapped run leaves the alias uncapped."""
    if any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


def _min_or_none(a: int | None, b: int | None) -> int | None:
    present = [v for v in (a, b) if v is not None]
    return min(present) if present else None


# ---------------------------------------------------------------------------------------------
# 3.-6. spend pauses, decisions, their rows, the Prefect limits


def pause_for_spend(steps: dict[str, BudgetStep]) -> list[str]:
    """Pause (ledger flag + audit row) every run a spend/billing error hit; returns them."""
    paused = []
    eng = engine()
    with eng.connect() as conn:
        already = set(
            conn.execute(
                select(PauseFlag.target).where(PauseFlag.scope == "run", PauseFlag.paused.is_(True))
            ).scalars()
        )
    for s in steps.values():
        for run_id in s.pause_runs:
            if run_id in already:
                continue
            set_pause(
                eng,
                "run",
                run_id,
                True,
                actor=PLANNER_ACTOR,
                reason=f"provider spend or billing error on alias {s.alias}: run paused by the "
                "planner; resume it once the spend cap or the billing problem is fixed",
            )
            paused.append(run_id)
    return paused


def decide_all(
    now: datetime, fleets: list[AliasFleet], steps: dict[str, BudgetStep]
) -> dict[str, Decision]:
    """One decision per alias the controller stepped (pure but for the curve reads)."""
    sizing = sizing_config()
    t = now.timestamp()
    decisions: dict[str, Decision] = {}
    for fleet in fleets:
        s = steps.get(fleet.alias)
        if s is None:
            continue
        state = FleetState(
            now=t,
            ages=fleet.ages,
            booting=fleet.booting,
            queued=fleet.queued,
            paused=fleet.paused or all(r in s.pause_runs for r in fleet.run_ids),
            in_cooldown=s.state.in_cooldown(t),
            stale=s.actions.stale,
            progress=s.progress,
            ramping=s.state.ramping(),
            instance_timeout_s=fleet.instance_timeout_s,
        )
        counting = Counting(
            cached_input_counts=s.state.cached_input_counts,
            combined=s.state.token_class == "combined",
        )
        curve = _fleet_curve(fleet)
        tuned = replace(sizing, overdrive=sizing.overdrive * s.overdrive)
        decisions[fleet.alias] = decide(state, curve, s.state.budgets, counting, fleet.caps, tuned)
    return decisions


class MixedCurve:
    """The usage curve of a fleet mixing harnesses, weighted by their share of its tasks: at
    age a, survival is the weighted mean of the parts' survivals and each rate is the
    survival-weighted mean of theirs (so a harness whose tasks end early stops counting)."""

    def __init__(self, parts: list[tuple[float, HarnessCurve]]) -> None:
        total = sum(w for w, _ in parts)
        self._parts = [(w / total, c) for w, c in parts if w > 0]

    def survival(self, age: FloatArray) -> FloatArray:
        return np.asarray(sum(w * np.clip(c.survival(age), 0.0, 1.0) for w, c in self._parts))

    def _rate(self, name: str, age: FloatArray) -> FloatArray:
        num = sum(
            w * np.clip(c.survival(age), 0.0, 1.0) * getattr(c, name)(age) for w, c in self._parts
        )
        return np.asarray(num / np.maximum(self.survival(age), 1e-12))

    def calls_per_s(self, age: FloatArray) -> FloatArray:
        return self._rate("calls_per_s", age)

    def cached_input_tokens_per_s(self, age: FloatArray) -> FloatArray:
        return self._rate("cached_input_tokens_per_s", age)

    def uncached_input_tokens_per_s(self, age: FloatArray) -> FloatArray:
        return self._rate("uncached_input_tokens_per_s", age)

    def output_tokens_per_s(self, age: FloatArray) -> FloatArray:
        return self._rate("output_tokens_per_s", age)

    def inflight_tokens(self, age: FloatArray) -> FloatArray:
        return self._rate("inflight_tokens", age)


def _fleet_curve(fleet: AliasFleet) -> Curve:
    """The newest curve of the fleet's harness, or the mix of its harnesses' curves."""
    weighted = [(float(n), h) for h, n in fleet.work if n > 0]
    if len(weighted) <= 1:
        return curve_for(fleet.harness).curve
    return MixedCurve([(w, curve_for(h).curve) for w, h in weighted])


def record_decisions(now: datetime, decisions: dict[str, Decision]) -> None:
    """Write one ``planner_decisions`` row per alias."""
    if not decisions:
        return
    with engine().begin() as conn:
        conn.execute(
            insert(PlannerDecision),
            [
                {
                    "alias": a,
                    "tick_at": now,
                    **d.as_row(),
                }
                for a, d in decisions.items()
            ],
        )


# (api, alias) -> (budgets, burst_s, cache-counting belief, old tasks first, pushed at)
_PUSHED: dict[tuple[str, str], tuple[Budgets, float, bool, bool, float]] = {}
_PUSHED_LOCK = threading.Lock()
REASSERT_S = 60.0


def push_pacer_limits(
    steps: dict[str, BudgetStep], decisions: dict[str, Decision] | None = None
) -> list[str]:
    """Write each alias's budgets to its Prefect limits, and the queue order its decision
    names (``Decision.old_tasks_first``); returns the aliases pushed.

    An alias whose budgets and burst are what this process pushed last is skipped unless that
    was ``REASSERT_S`` ago (a limit edited in the UI is restored within a minute): each push is
    a few Prefect API calls, and the embedded demo's SQLite-backed server is short of them.
    """
    from prefect.settings import PREFECT_API_URL
    from prefect.utilities.asyncutils import run_coro_as_sync

    api = str(PREFECT_API_URL.value())
    known = aliases()
    writes: list[_BudgetWrite] = []
    for name, s in sorted(steps.items()):
        with _PUSHED_LOCK:
            last = _PUSHED.get((api, name))
        at = time.monotonic()
        decision = (decisions or {}).get(name)
        old_first = True if decision is None else decision.old_tasks_first
        pushed_now = (s.state.budgets, s.burst_s, s.state.cached_input_counts, old_first)
        if last is not None and last[:4] == pushed_now and at - last[4] < REASSERT_S:
            continue
        alias = known.get(name)
        alias = alias.model_copy(
            update={"pacer": alias.pacer.model_copy(update={"burst_s": s.burst_s})}
        )
        counts = s.state.cached_input_counts
        # the variable is written only when the belief leaves the config's or changes again
        # (each write is an API call the embedded SQLite-backed server is short of)
        write = counts != alias.cached_input_counts if last is None else counts != last[2]
        # the order at this process's first push (a previous planner process may have left
        # its run's endgame order behind) and whenever it changes
        write_order = last is None or old_first != last[3]
        writes.append(
            _BudgetWrite(
                alias=alias,
                budgets=s.state.budgets,
                cached_input_counts=counts if write else None,
                old_tasks_first=old_first if write_order else None,
                pushed=(*pushed_now, at),
            )
        )
    if writes:
        run_coro_as_sync(_write_budgets(writes))
        with _PUSHED_LOCK:
            for w in writes:
                _PUSHED[(api, w.alias.name)] = w.pushed
    return [w.alias.name for w in writes]


@dataclass(frozen=True)
class _BudgetWrite:
    """One alias's push: what ``push_budgets`` writes, and what ``_PUSHED`` records after."""

    alias: Alias
    budgets: Budgets
    cached_input_counts: bool | None
    old_tasks_first: bool | None
    pushed: tuple[Budgets, float, bool, bool, float]


async def _write_budgets(writes: list[_BudgetWrite]) -> None:
    """Every alias's push through one Prefect client: building one costs ~50 ms of CPU, and a
    client per write made three per alias per tick."""
    from prefect.client.orchestration import get_client

    from gateway.pacer_prefect import push_budgets

    async with get_client() as client:
        for w in writes:
            await push_budgets(
                w.alias,
                w.budgets,
                cached_input_counts=w.cached_input_counts,
                old_tasks_first=w.old_tasks_first,
                client=client,
            )


def plan_tick(now: datetime, prefect_paused: bool) -> dict[str, Decision]:
    """The ledger part of one tick (steps 1-5) in one call; the loop flow runs them as tasks."""
    fleets = read_fleet(now, prefect_paused)
    steps = advance_budgets(now, {f.alias: f.harness for f in fleets})
    pause_for_spend(steps)
    decisions = decide_all(now, fleets, steps)
    record_decisions(now, decisions)
    return decisions


def decision_table(
    decisions: dict[str, Decision], steps: dict[str, BudgetStep] | None = None
) -> list[dict[str, Any]]:
    """Rows of the planner's Prefect table artifact."""
    rows = []
    for alias, d in sorted(decisions.items()):
        s = (steps or {}).get(alias)
        rows.append(
            {
                "alias": alias,
                "ceiling": d.ceiling,
                "live": d.live,
                "booting": d.booting,
                "queued": d.queued,
                "launches_allowed": d.launches_allowed,
                "binding": d.binding.value,
                "calls_per_s": round(d.budgets.get("calls_per_s", 0.0), 3),
                "tokens_per_s": round(d.budgets.get("tokens_per_s", 0.0), 1),
                "cut": ",".join(s.actions.cut) if s else "",
                "overdrive": round(s.overdrive, 3) if s else 1.0,
                # the pacer's order while an output limit holds its queue
                "output_queue": "oldest task first" if d.old_tasks_first else "arrival",
                "at": datetime.fromtimestamp(d.now, UTC).isoformat(timespec="seconds"),
            }
        )
    return rows
