"""Dispatch: how many jobs of each run may start now, claiming them, and the two launchers.

Admission (per pass, ``admission``): a run's ceiling is

    min(static cap, its task cap, its ceiling override, its fair share of its alias's ceiling)

where the alias's ceiling is min(the planner's latest ``planner_decisions.ceiling``, the operator's
alias override). A decision is in force for ``decision_max_age_s`` (default four planner ticks);
without one in force — a new alias before the planner's first tick, a decision left from an
earlier busy period, a planner that stopped deciding — the alias's ceiling is the conservative
``bootstrap_ceiling`` (``EVALFLEET_BOOTSTRAP_CEILING``, 4), not the static cap: the first pass
of a run no longer fills the static cap before the planner has looked at the alias, and a dead
planner slows the alias to the bootstrap ceiling (logged as a warning) instead of stalling it
or leaving it at a ceiling nobody revises. Runs on one alias split it by
priority, each within its own caps and demand (``planner.shares.fair_shares``: a share one run
cannot use goes to the others). A run's allowance is its ceiling minus its live tasks (booting +
running, ``INSTANCE_CALLING``: a claimed job is ``booting`` before its flow run exists, so it
counts at once; an ``evaluating`` instance is done with the LLM and does not), at most its queued jobs. The allowances are then bounded, again by priority, by what is
left of the alias's ceiling, of the static cap (live tasks of every run count) and of the
launcher's free slots. A paused harness pool admits nothing; a paused run (flag or state) keeps
its live tasks but gets no new ones. ``claim_admitted`` claims each run's own allowance
(``ledger.queue.claim(..., run_id=...)``), so the fleet follows the shares, not FIFO across runs;
``claim`` re-checks the pause flags and run states inside its own statement.

The launchers (in-process and work-pool, one interface) are in ``tasks.launchers``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from evalfleet.settings import get_settings
from evalfleet.states import INSTANCE_CALLING, RUN_CLAIMABLE, RUN_TERMINAL
from ledger.clock import as_utc
from ledger.controls import alias_ceiling_overrides
from ledger.models import InstanceResult, Job, PauseFlag, PlannerDecision, Run
from ledger.queue import MAX_CLAIM, Lease, claim
from planner.shares import RunDemand, fair_shares
from tasks.ledger_io import engine, sessions

log = logging.getLogger(__name__)
_CALLING = tuple(s.value for s in INSTANCE_CALLING)
_CLAIMABLE = tuple(s.value for s in RUN_CLAIMABLE)
_TERMINAL = tuple(s.value for s in RUN_TERMINAL)
HARNESS_POOL = "harness"


@dataclass(frozen=True)
class RunLoad:
    """One live run as admission sees it. ``claimable``: its state lets jobs be claimed."""

    run_id: str
    alias: str
    priority: float
    task_cap: int | None
    ceiling_override: int | None
    live: int
    queued: int
    paused: bool
    claimable: bool = True

    @property
    def admits(self) -> bool:
        """Whether the run may get new tasks at all (not paused, in a claimable state)."""
        return self.claimable and not self.paused


@dataclass(frozen=True)
class Fleet:
    """What admission reads from the ledger in one pass. ``planner_ceilings``: the planner
    decisions in force; an alias without one gets ``bootstrap_ceiling``."""

    loads: tuple[RunLoad, ...]
    pool_paused: bool
    planner_ceilings: Mapping[str, int] = field(default_factory=dict)
    alias_overrides: Mapping[str, int] = field(default_factory=dict)
    bootstrap_ceiling: int = field(kw_only=True)

    def unplanned(self) -> set[str]:
        """Aliases with work to admit but no planner decision in force."""
        return {x.alias for x in self.loads if x.admits and x.queued} - set(self.planner_ceilings)


@dataclass(frozen=True)
class Admission:
    """Per run: its ceiling and how many of its jobs may be claimed now."""

    ceilings: Mapping[str, int]
    allowed: Mapping[str, int]

    @property
    def total(self) -> int:
        return sum(self.allowed.values())


def run_loads() -> list[RunLoad]:
    """Live and queued counts of every run that is not terminal (harness pool)."""
    with engine().connect() as conn:
        runs = conn.execute(
            select(
                Run.id, Run.alias, Run.priority, Run.task_cap, Run.ceiling_override, Run.state
            ).where(Run.state.not_in(_TERMINAL))
        ).all()
        live: dict[str, int] = {
            run_id: int(n)
            for run_id, n in conn.execute(
                select(InstanceResult.run_id, func.count())
                .where(InstanceResult.state.in_(_CALLING))
                .group_by(InstanceResult.run_id)
            ).all()
        }
        queued: dict[str, int] = {
            run_id: int(n)
            for run_id, n in conn.execute(
                select(Job.run_id, func.count())
                .where(Job.pool == HARNESS_POOL, Job.lease_token.is_(None))
                .group_by(Job.run_id)
            ).all()
        }
        paused = set(
            conn.execute(
                select(PauseFlag.target).where(PauseFlag.scope == "run", PauseFlag.paused.is_(True))
            ).scalars()
        )
    return [
        RunLoad(
            run_id=r.id,
            alias=r.alias,
            priority=float(r.priority),
            task_cap=r.task_cap,
            ceiling_override=r.ceiling_override,
            live=int(live.get(r.id, 0)),
            queued=int(queued.get(r.id, 0)),
            paused=r.id in paused,
            claimable=r.state in _CLAIMABLE,
        )
        for r in runs
    ]


def planner_ceilings(aliases: set[str], decided_after: datetime | None = None) -> dict[str, int]:
    """The latest planner ceiling per alias; aliases the planner has not decided, or whose
    latest decision is older than ``decided_after`` (timezone-aware), are absent."""
    if not aliases:
        return {}
    # one max(id) per alias, each read from the end of its range of ix_planner_decisions_alias_id
    # (one index entry); a GROUP BY over the aliases read every decision they ever had (a row
    # per alias per tick: thousands a day) at each dispatch pass
    newest = [
        select(func.max(PlannerDecision.id)).where(PlannerDecision.alias == alias).scalar_subquery()
        for alias in sorted(aliases)
    ]
    with engine().connect() as conn:
        rows = conn.execute(
            select(PlannerDecision.alias, PlannerDecision.ceiling, PlannerDecision.tick_at).where(
                PlannerDecision.id.in_(newest)
            )
        ).all()
    return {
        alias: int(ceiling)
        for alias, ceiling, tick_at in rows
        if decided_after is None or as_utc(tick_at) >= decided_after
    }


def pool_paused(pool: str = HARNESS_POOL) -> bool:
    """Whether the ledger's pause flag of ``pool`` is set."""
    with engine().connect() as conn:
        row = conn.execute(
            select(PauseFlag.paused).where(PauseFlag.scope == "pool", PauseFlag.target == pool)
        ).first()
    return bool(row is not None and row[0])


def read_fleet() -> Fleet:
    """Everything one admission pass needs, read from the ledger (decisions older than the
    settings' ``decision_max_age_s`` are not in force)."""
    settings = get_settings()
    loads = tuple(run_loads())
    aliases = {x.alias for x in loads}
    with sessions()() as session:
        overrides = {a: v for a, v in alias_ceiling_overrides(session).items() if a in aliases}
    fresh = datetime.now(UTC) - timedelta(seconds=settings.decision_max_age_s)
    return Fleet(
        loads,
        pool_paused(),
        planner_ceilings(aliases, fresh),
        overrides,
        bootstrap_ceiling=settings.bootstrap_ceiling,
    )


class UnplannedLog:
    """Says when an alias is admitted on the bootstrap ceiling: once at info when it starts
    (expected for a new run, until the planner's first tick), then a warning every
    ``warn_every_s`` while it lasts longer than that (the planner is down or not deciding)."""

    def __init__(self) -> None:
        self._since: dict[str, float] = {}
        self._warned: dict[str, float] = {}
        self._lock = threading.Lock()

    def note(self, fleet: Fleet, warn_every_s: float, now: float | None = None) -> list[str]:
        """Log for this pass; returns the aliases warned about."""
        at = time.monotonic() if now is None else now
        waiting = fleet.unplanned()
        warned = []
        with self._lock:
            for alias in sorted(waiting):
                since = self._since.setdefault(alias, at)
                if since == at:
                    log.info(
                        "alias %s: no planner decision in force; admitting at most %d live "
                        "instances (EVALFLEET_BOOTSTRAP_CEILING) until the planner decides",
                        alias,
                        fleet.bootstrap_ceiling,
                    )
                elif at - self._warned.get(alias, since) >= warn_every_s:
                    self._warned[alias] = at
                    warned.append(alias)
                    log.warning(
                        "alias %s: no planner decision for %.0f s; the dispatcher keeps admitting "
                        "at most %d live instances (EVALFLEET_BOOTSTRAP_CEILING). Is the planner "
                        "loop running?",
                        alias,
                        at - since,
                        fleet.bootstrap_ceiling,
                    )
            for alias in set(self._since) - waiting:
                self._since.pop(alias, None)
                self._warned.pop(alias, None)
        return warned


UNPLANNED = UnplannedLog()


def _own_cap(load: RunLoad, static_cap: int) -> int:
    caps = [static_cap]
    caps += [c for c in (load.task_cap, load.ceiling_override) if c is not None]
    return max(0, min(caps))


def alias_ceiling(fleet: Fleet, alias: str, static_cap: int) -> int:
    """min(planner ceiling (the bootstrap ceiling while none is in force), operator alias
    override, static cap)."""
    values = [static_cap, fleet.planner_ceilings.get(alias, fleet.bootstrap_ceiling)]
    if alias in fleet.alias_overrides:
        values.append(fleet.alias_overrides[alias])
    return max(0, min(values))


def run_ceilings(fleet: Fleet, static_cap: int) -> dict[str, int]:
    """Each run's ceiling: min(static cap, its cap, its override, its share of the alias)."""
    ceilings: dict[str, int] = {}
    for alias in sorted({load.alias for load in fleet.loads}):
        demands = []
        for load in (x for x in fleet.loads if x.alias == alias):
            cap = _own_cap(load, static_cap)
            # a run that admits nothing can still hold (and use) the slots of its live tasks
            wanted = load.live + (load.queued if load.admits else 0)
            demands.append(RunDemand(load.run_id, load.priority, min(cap, wanted)))
        ceilings.update(fair_shares(alias_ceiling(fleet, alias, static_cap), demands))
    return ceilings


def _bounded(room: int, loads: Sequence[RunLoad], wanted: Mapping[str, int]) -> dict[str, int]:
    """Cut ``wanted`` down to ``room`` in total, by priority (unchanged when it fits)."""
    if sum(wanted.values()) <= room:
        return dict(wanted)
    demands = [RunDemand(x.run_id, x.priority, wanted[x.run_id]) for x in loads]
    return dict(fair_shares(max(0, room), demands))


def plan_admission(fleet: Fleet, static_cap: int, free_slots: int) -> Admission:
    """Pure: how many jobs of each run may be claimed now (see the module docstring)."""
    ceilings = run_ceilings(fleet, static_cap)
    if fleet.pool_paused:
        return Admission(ceilings, {x.run_id: 0 for x in fleet.loads})
    wanted = {
        x.run_id: max(0, min(ceilings[x.run_id] - x.live, x.queued)) if x.admits else 0
        for x in fleet.loads
    }
    for alias in {x.alias for x in fleet.loads}:
        on_alias = [x for x in fleet.loads if x.alias == alias]
        room = alias_ceiling(fleet, alias, static_cap) - sum(x.live for x in on_alias)
        wanted.update(_bounded(room, on_alias, {x.run_id: wanted[x.run_id] for x in on_alias}))
    room = min(static_cap - sum(x.live for x in fleet.loads), free_slots)
    return Admission(ceilings, _bounded(room, fleet.loads, wanted))


def admission(static_cap: int, free_slots: int) -> Admission:
    """``plan_admission`` on the ledger's current state (logging aliases on the bootstrap)."""
    fleet = read_fleet()
    UNPLANNED.note(fleet, get_settings().decision_max_age_s)
    return plan_admission(fleet, static_cap, free_slots)


def claim_admitted(allowed: Admission) -> list[Lease]:
    """Claim each run's allowance from its own jobs (nothing while paused: checked at claim)."""
    leases: list[Lease] = []
    for run_id, k in sorted(allowed.allowed.items()):
        while k > 0:
            got = claim(engine(), HARNESS_POOL, min(k, MAX_CLAIM), run_id=run_id)
            leases.extend(got)
            if len(got) < min(k, MAX_CLAIM):
                break
            k -= len(got)
    return leases
