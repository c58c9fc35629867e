"""The planner loop's budget controller step: per alias, the ``planner.budgets`` state is loaded
from the ledger (``ledger.pacer_state``), stepped with what the gateway recorded since the
previous tick (``ledger.pacer_window``), and saved — so a restarted loop continues with the same
budgets, cooldowns and 429 memory.

* Seeding: the ``pacer_configs`` row (the operator's values in force and its seed and
  ``seeded_at``), else the alias file's seed; headers the provider stated within the staleness
  limit win (``initial_state``). A new ``pacer_configs`` version (an operator edit or re-base)
  re-seeds the state, keeping a running cooldown.
* Each tick: ``read_window`` (429s by limit type, overloads, spend errors and the runs they hit,
  utilisation of each budget) and the headers observed since the previous tick go into one
  ``WindowObservation``; a stale seed with fresh headers is re-seeded to the stated limits
  first. The fleet's progress (pacer stretch, ``planner.sizing.FleetState.progress``) is
  smoothed from the window's pacer waits and kept with the state.
* The saturation controller (``planner.sizing.hold_overdrive``, as the simulator's planner
  policy uses it): a curve's projection is an average, and a run whose tasks draw less than it
  says leaves the limit idle with a fleet the curve calls big enough. The window's measured use
  of the budget the previous decision sized the fleet on (``llm_calls`` counted by
  ``read_window``: the gateway records every call) is fed to it when that window says something
  about the curve: the previous decision was ``paced`` on a saturating budget, it was the
  previous tick's, no cooldown froze the fleet, and the alias's busy period is past its warm-up
  (boot + one mean task life: a fleet still filling up under-uses the budget whatever the
  curve). The multiplier scales the sizing's overdrive; it is kept in ``pacer_states`` with
  the busy period's start. A tick after a gap of ``BUSY_GAP_TICKS`` ticks starts a new busy
  period at multiplier 1.

Also here: the aliases in force and the per-process ``CurveCache`` (a curve version written
between two ticks is used at the next one).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import Connection, Engine, select
from sqlalchemy.orm import Session

from evalfleet.errors import NotFound
from evalfleet.settings import get_settings
from gateway.aliases import Alias, Aliases, load_aliases
from gateway.pacer_local import seed_budgets, token_class
from ledger import pacer_state, pacer_window
from ledger.clock import as_utc
from ledger.curves import CurveCache, StoredCurve
from ledger.models import PacerConfig
from planner.budgets import (
    BudgetClass,
    Budgets,
    BudgetState,
    ControllerActions,
    ControllerConfig,
    SeedSource,
    WindowObservation,
    header_budgets,
    initial_state,
    recounted,
    step,
)
from planner.classify import LimitType
from planner.curves import DEFAULT_HARNESS, HarnessCurve
from planner.decision import Binding, Quantity
from planner.inflight_use import sized_by_inflight
from planner.sizing import Counting, OverdriveConfig, SizingConfig, hold_overdrive, steady_state
from tasks.ledger_io import engine
from tasks.plan_counting import CountingEvidence, advance, judge_by_drain
from tasks.plan_settle import settled_drained

log = logging.getLogger(__name__)

#: A tick this many planner ticks after the alias's previous one starts a new busy period.
BUSY_GAP_TICKS = 3.0
_BUDGET_CLASS = {
    Quantity.CALLS.value: BudgetClass.REQUESTS,
    Quantity.TOKENS.value: BudgetClass.TOKENS,
    Quantity.OUTPUT_TOKENS.value: BudgetClass.OUTPUT_TOKENS,
    Quantity.INFLIGHT_TOKENS.value: BudgetClass.INFLIGHT,
}


@dataclass(frozen=True)
class BudgetStep:
    """The controller's tick for one alias: its new state, what it did, runs to pause."""

    alias: str
    state: BudgetState
    actions: ControllerActions
    pause_runs: tuple[str, ...]
    burst_s: float
    cooldown_s: float
    progress: float = 1.0
    overdrive: float = 1.0  # the saturation controller's multiplier of the sizing's overdrive


def aliases() -> Aliases:
    """The aliases in force (the settings' file, else the embedded default)."""
    s = get_settings()
    return load_aliases(s.aliases_file, provider_sim_url=s.provider_sim_url)


def sizing_config() -> SizingConfig:
    """The planner's sizing constants, with the settings' boot time, token overdrive, launch
    ramp, the duration spread that keeps old tasks first, and the instance timeout's margin
    and floor."""
    settings = get_settings()
    return SizingConfig(
        boot_s=settings.planner_boot_s,
        token_overdrive=settings.planner_token_overdrive,
        token_max_wait_s=settings.planner_token_max_wait_s,
        ramp_floor=settings.planner_launch_ramp_floor,
        ramp_growth=settings.planner_launch_ramp_growth,
        old_first_min_spread=settings.planner_old_first_min_spread,
        timeout_margin=settings.planner_timeout_margin,
        timeout_floor=settings.planner_timeout_floor,
    )


@functools.cache
def curve_cache(eng: Engine) -> CurveCache:
    """One ``CurveCache`` per process (and ledger engine)."""
    return CurveCache(eng)


def curve_for(harness: str) -> StoredCurve:
    """The harness's newest curve; the default harness's when it has none (stored or shipped)."""
    cache = curve_cache(engine())
    try:
        return cache.get(harness)
    except NotFound:
        return cache.get(DEFAULT_HARNESS)


def _row_budgets(values: dict[str, Any]) -> Budgets:
    return Budgets(
        calls_per_s=float(values["calls_per_s"]),
        tokens_per_s=float(values["tokens_per_s"]),
        output_tokens_per_s=(
            None if values.get("output_tokens_per_s") is None else values["output_tokens_per_s"]
        ),
        inflight_tokens=float(values["inflight_tokens"]),
    )


def _seeded(
    conn: Connection, alias: Alias, row: PacerConfig | None, now: datetime, cfg: ControllerConfig
) -> BudgetState:
    """A fresh controller state from the ``pacer_configs`` row, else the alias file's seed."""
    headers = pacer_window.fresh_header_limits(
        conn, alias.name, now - timedelta(seconds=cfg.stale_after_s)
    )
    if row is None:
        return initial_state(
            seed_budgets(alias),
            now.timestamp(),
            observed_limits=headers,
            cached_input_counts=alias.cached_input_counts,
            token_class=token_class(alias),
            config=cfg,
        )
    state = initial_state(
        _row_budgets(dict(row.seed)),
        now.timestamp(),
        seeded_at=as_utc(row.seeded_at).timestamp(),
        cached_input_counts=row.cached_input_counts,
        token_class=token_class(alias),
        config=cfg,
    )
    in_force = _row_budgets(
        {k: getattr(row, k) for k in ("calls_per_s", "tokens_per_s", "inflight_tokens")}
        | {"output_tokens_per_s": row.output_tokens_per_s}
    )
    state = replace(state, budgets=in_force, seed_source=cast(SeedSource, row.seed_source))
    return state  # the tick's step applies the stated limits (hard caps) to the row's values


def _reseeded(state: BudgetState, headers: dict[LimitType, float]) -> BudgetState:
    """A stale seed with fresh headers: the stated limits become the budgets (``step`` then
    makes them the seed and hard caps). Without this, a stale budget far below the stated
    limit would stay there, growing 5% per window."""
    caps = header_budgets(headers, token_class=state.token_class, has_output_budget=True)
    budgets = state.budgets
    for cls, cap in caps.items():
        budgets = budgets.with_value(cls, cap)
    return replace(state, budgets=budgets)


@dataclass(frozen=True)
class _Prior:
    """Where an alias's tick starts from (see ``_prior``)."""

    state: BudgetState
    after_id: int  # the ``llm_calls`` watermark
    since: datetime  # headers observed after this are new
    window_s: float
    progress: float
    overdrive: float
    busy_since: datetime
    tick_at: datetime | None  # the previous tick (None: first)
    counting: CountingEvidence = field(default_factory=CountingEvidence)


def _prior(
    conn: Connection,
    alias: Alias,
    row: PacerConfig | None,
    version: int,
    now: datetime,
    cfg: ControllerConfig,
) -> _Prior:
    """The saved state (re-seeded if an operator edited the pacer since), or a fresh seed that
    observes calls from now on and headers of the last ``stale_after_s``; after a gap of
    ``BUSY_GAP_TICKS`` ticks a new busy period (overdrive 1, warm-up from now)."""
    stored = pacer_state.load_state(conn, alias.name)
    if stored is None:
        state = _seeded(conn, alias, row, now, cfg)
        since = now - timedelta(seconds=cfg.stale_after_s)
        return _Prior(
            state, pacer_window.latest_call_id(conn), since, cfg.window_s, 1.0, 1.0, now, None
        )
    state = stored.state
    if stored.config_version != version:  # an operator edited the pacer
        fresh = _seeded(conn, alias, row, now, cfg)
        state = replace(
            fresh,
            cooldown_until=state.cooldown_until,
            backoff_until=state.backoff_until,
            # what the provider said before the edit still holds: no new launch ramp
            answered=state.answered or fresh.answered,
            throttled=state.throttled,
        )
    window_s = max((now - stored.tick_at).total_seconds(), 1.0)
    overdrive, busy_since = stored.overdrive, stored.busy_since or now
    if window_s > BUSY_GAP_TICKS * cfg.window_s:
        overdrive, busy_since = 1.0, now
    return _Prior(
        state,
        stored.last_call_id,
        stored.tick_at,
        window_s,
        stored.progress,
        overdrive,
        busy_since,
        stored.tick_at,
        CountingEvidence.from_json(stored.counting, source=f"pacer_states {alias.name!r}"),
    )


def _drained_for_blame(
    conn: Connection,
    name: str,
    now: datetime,
    state: BudgetState,
    counting: CountingEvidence,
) -> tuple[dict[BudgetClass, float], CountingEvidence, BudgetState]:
    """The drained rates the blame of a 429 that names no limit reads
    (``pacer_window.drained_rates``). Each such tick is also a sample of the cache-counting
    belief's test without headers (``tasks.plan_counting.judge_by_drain``): where the samples
    contradict the belief it flips first (the token budget to the limit they measured), and
    the rates read the new units. Returns the rates, the evidence and the state."""
    believed = state.cached_input_counts
    read = pacer_window.drained_rates(
        conn, name, now, token_class=state.token_class, cached_input_counts=believed
    )
    rates = read.rates
    if state.budgets.output_tokens_per_s is None:
        rates = {k: v for k, v in rates.items() if k is not BudgetClass.OUTPUT_TOKENS}
    counting, counts, measured = judge_by_drain(
        counting, rates, read.other_tokens, believed=believed
    )
    if counts == believed:
        return read.rates, counting, state
    log.warning(
        "alias %s: at its 429s the token bucket drained steadily only with cache reads %s, "
        "not as believed: pacing, sizing and the token budget (%.6g/s) follow",
        name,
        "counted" if counts else "not counted",
        measured,
    )
    flipped = {**read.rates, BudgetClass.TOKENS: read.other_tokens}
    return flipped, counting, recounted(state, counts, now.timestamp(), measured)


def _fed_by(previous: pacer_state.PreviousDecision) -> bool:
    """``Decision.feeds_saturation`` of a stored decision: the budgets set the fleet
    (``sized_by`` paced) and only a stale-config label overrode them. A row written before
    ``sized_by`` existed counts as paced only when its binding says so."""
    sized_by = previous.sized_by if previous.sized_by is not None else previous.binding
    return sized_by == Binding.PACED.value and previous.binding in (
        Binding.PACED.value,
        Binding.STALE_CONFIG.value,
    )


def _of_previous_tick(
    prior: _Prior, previous: pacer_state.PreviousDecision | None
) -> pacer_state.PreviousDecision | None:
    """The stored decision when the previous tick wrote it (None otherwise): a decision of an
    earlier tick says nothing of this window."""
    if previous is None or prior.tick_at is None:
        return None
    if abs((previous.tick_at - prior.tick_at).total_seconds()) > 1.0:
        return None
    return previous


def _sized_by_inflight(prior: _Prior, previous: pacer_state.PreviousDecision | None) -> bool:
    """The previous tick's decision sized the fleet by the in-flight budget
    (``planner.inflight_use``)."""
    last = _of_previous_tick(prior, previous)
    return last is not None and sized_by_inflight(last.binding, last.sized_by)


def held_overdrive(
    prior: _Prior,
    previous: pacer_state.PreviousDecision | None,
    state: BudgetState,
    utilisation: dict[BudgetClass, float],
    now: datetime,
    warmup_s: float,
    config: OverdriveConfig | None = None,
) -> float:
    """The saturation controller's multiplier after this window (see the module docstring)."""
    last = _of_previous_tick(prior, previous)
    if (
        last is None
        or not _fed_by(last)
        or last.saturating not in _BUDGET_CLASS
        or state.in_cooldown(now.timestamp())
        or (now - prior.busy_since).total_seconds() < warmup_s
    ):
        return prior.overdrive
    util = utilisation.get(_BUDGET_CLASS[str(last.saturating)])
    if util is None:
        return prior.overdrive
    return hold_overdrive(prior.overdrive, util, config or OverdriveConfig())


def advance_budgets(now: datetime, harnesses: dict[str, str]) -> dict[str, BudgetStep]:
    """Step each alias's controller over the calls since its previous tick, update the fleet's
    progress (pacer stretch) and save both. ``harnesses``: alias -> the harness of its work."""
    settings = get_settings()
    known = aliases()
    out: dict[str, BudgetStep] = {}
    eng = engine()
    for name, harness in sorted(harnesses.items()):
        alias = known.find(name)
        if alias is None:
            log.error("alias %s of a claimable run is not configured: not planned", name)
            continue
        with eng.connect() as conn:
            with Session(bind=conn, expire_on_commit=False) as session:
                row = session.scalars(
                    select(PacerConfig).where(PacerConfig.alias == name)
                ).one_or_none()
                if row is not None:
                    session.expunge(row)
            burst_s = row.burst_s if row is not None else alias.pacer.burst_s
            cooldown_s = row.cooldown_s if row is not None else alias.pacer.cooldown_s
            cfg = ControllerConfig(
                window_s=min(max(settings.planner_tick_s, 1.0), 300.0), cooldown_s=cooldown_s
            )
            version = row.version if row is not None else 0
            prior = _prior(conn, alias, row, version, now, cfg)
            state = prior.state
            window = pacer_window.read_window(
                conn,
                name,
                prior.after_id,
                token_class=state.token_class,
                cached_input_counts=state.cached_input_counts,
            )
            headers = pacer_window.fresh_header_limits(conn, name, prior.since)
            counting, counts = advance(
                conn,
                name,
                prior.counting,
                token_class=state.token_class,
                believed=state.cached_input_counts,
                now=now,
            )
            previous = pacer_state.previous_decision(conn, name)
            drained = None
            if LimitType.UNKNOWN in window.throttles:
                believed = state.cached_input_counts
                drained, counting, state = _drained_for_blame(conn, name, now, state, counting)
                if state.cached_input_counts != believed:
                    counts = state.cached_input_counts  # the drain's flip stands
            delivered = (
                pacer_window.accepted_rates(
                    conn,
                    name,
                    now - timedelta(seconds=cfg.cooldown_s),
                    now,
                    token_class=state.token_class,
                    cached_input_counts=state.cached_input_counts,
                )
                if window.throttles
                else None
            )
            settled = settled_drained(conn, name, state, now)
        if headers and state.is_stale(now.timestamp()):
            state = _reseeded(state, headers)
        utilisation = window.utilisation(state.budgets, prior.window_s)
        obs = WindowObservation(
            now=now.timestamp(),
            throttles=tuple((lt, None) for lt in window.throttles),
            overloads=window.overloads,
            spend_errors=window.spend_errors,
            observed_limits=headers,
            utilisation=utilisation,
            delivered=delivered,
            drained=drained,
            answered=window.answered,
            largest_accepted=window.largest_accepted(),
            sized_by_inflight=_sized_by_inflight(prior, previous),
            settled_drained=settled,
        )
        state, actions = step(state, obs, cfg)
        if counts != state.cached_input_counts:
            log.warning(
                "alias %s: the provider's stated token bucket says cache reads %s against its "
                "limit, not as believed: pacing, sizing and the token budget follow",
                name,
                "count" if counts else "do not count",
            )
            state = recounted(state, counts, now.timestamp())
        curve = curve_for(harness).curve
        progress = _smoothed(prior.progress, window, curve, prior.window_s)
        warmup_s = sizing_config().boot_s + curve.mean_duration_s()
        overdrive = held_overdrive(prior, previous, state, utilisation, now, warmup_s)
        if abs(overdrive - prior.overdrive) >= 0.05 * prior.overdrive:
            log.info(
                "alias %s: saturation overdrive x%.2f -> x%.2f", name, prior.overdrive, overdrive
            )
        for note in actions.notes:
            log.info("alias %s: %s", name, note)
        pacer_state.save_state(
            eng,
            pacer_state.StoredState(
                alias=name,
                state=state,
                config_version=version,
                last_call_id=max(window.last_call_id, prior.after_id),
                tick_at=now,
                progress=progress,
                overdrive=overdrive,
                busy_since=prior.busy_since,
                counting=counting.to_json(),
            ),
        )
        out[name] = BudgetStep(
            alias=name,
            state=state,
            actions=actions,
            pause_runs=window.spend_runs if actions.pause_run else (),
            burst_s=burst_s,
            cooldown_s=cooldown_s,
            progress=progress,
            overdrive=overdrive,
        )
    return out


def _smoothed(
    progress: float, window: pacer_window.WindowCalls, curve: HarnessCurve, window_s: float
) -> float:
    """The fleet's progress, smoothed over about one task lifetime (as ``sim.planner_policy``):
    1 / (1 + pacer wait per call / a task's mean gap between calls)."""
    sizing = sizing_config()
    gap = steady_state(curve, Counting(), sizing.boot_s, sizing.integration_age_s).mean_gap_s
    measured = window.stretch_progress(gap)
    if measured is None:
        return progress
    weight = min(1.0, window_s / max(curve.mean_duration_s(), 1.0))
    return min(1.0, max(0.05, progress + weight * (measured - progress)))
