"""Fleet sizing (planner/sizing.py): the decision rules, the booting and stale-config lessons."""

from __future__ import annotations

import ast
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from evalfleet.errors import ConfigError
from planner.curves import HarnessCurve, default_curve
from planner.decision import Binding, Decision, Quantity
from planner.sizing import (
    Caps,
    Counting,
    FleetState,
    OverdriveConfig,
    SizingConfig,
    decide,
    hold_overdrive,
    project,
    steady_state,
)

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class B:
    calls_per_s: float = 1000.0
    tokens_per_s: float = 33_333.0
    output_tokens_per_s: float | None = None
    inflight_tokens: float = 1e9


def flat_curve(calls: float = 0.2, uncached: float = 100.0, cached: float = 400.0) -> HarnessCurve:
    """A task that calls at a constant rate and lives ~300 s (exponential survival)."""
    return HarnessCurve.from_params(
        {
            "format": 1,
            "harness": "flat",
            "rates": {
                "age_s": [0.0, 600.0],
                "calls_per_s": [calls, calls],
                "cached_input_tokens_per_s": [cached, cached],
                "uncached_input_tokens_per_s": [uncached, uncached],
                "output_tokens_per_s": [10.0, 10.0],
                "inflight_tokens": [1000.0, 1000.0],
                "inflight_calls": [0.2, 0.2],
            },
            "survival": {"age_s": [0.0], "value": [1.0], "tail_s": 300.0},
            "latency": {"base_s": 1.0, "per_output_token_s": 0.01},
        }
    )


def fleet(
    ages: list[float] | np.ndarray, booting: int = 0, queued: int = 1000, **kw: bool
) -> FleetState:
    return FleetState(
        now=0.0, ages=np.asarray(ages, dtype=float), booting=booting, queued=queued, **kw
    )


CFG = SizingConfig(boot_s=30.0)


def test_empty_fleet_is_sized_the_token_overdrive_above_a_token_budget() -> None:
    """A token budget that saturates is sized ``token_overdrive`` above it (the pacer admits
    the smallest prompts first and holds the rest); with a token overdrive of 1.1 it is sized
    a little above it, as a calls budget is."""
    curve = flat_curve()
    # a refilled slot draws 100 uncached tokens/s x 300/(30+300) of the time
    slot = 100.0 * 300.0 / 330.0
    for cfg in (CFG, replace(CFG, token_overdrive=1.1)):
        d = decide(fleet([]), curve, B(tokens_per_s=10_000.0), Counting(), Caps(), cfg)
        assert d.binding is Binding.PACED
        assert d.saturating is Quantity.TOKENS
        over = d.projections["tokens_per_s"] / 10_000.0
        assert cfg.token_overdrive * 0.9 < over < cfg.token_overdrive * 1.15
        assert d.ceiling == pytest.approx(10_000.0 * cfg.token_overdrive / slot, rel=0.2)
        assert d.launches_allowed == d.ceiling


def test_empty_fleet_is_sized_a_little_above_a_calls_budget() -> None:
    curve = flat_curve()
    d = decide(fleet([]), curve, B(calls_per_s=2.0), Counting(), Caps(), CFG)
    assert d.binding is Binding.PACED
    assert d.saturating is Quantity.CALLS
    assert 1.0 < d.projections["calls_per_s"] / 2.0 < 1.25


def test_cached_tokens_counted_shrink_the_fleet_by_the_cache_share() -> None:
    curve = flat_curve(uncached=100.0, cached=400.0)
    uncounted = decide(fleet([]), curve, B(tokens_per_s=10_000.0), Counting(), Caps(), CFG)
    counted = decide(
        fleet([]), curve, B(tokens_per_s=10_000.0), Counting(cached_input_counts=True), Caps(), CFG
    )
    assert counted.ceiling * 4 < uncounted.ceiling < counted.ceiling * 6


def test_booting_tasks_are_counted_and_a_blind_planner_overshoots() -> None:
    """Lesson: booting tasks are age-0 candidates. A planner blind to them launches the
    whole fleet again every tick while the first wave boots."""
    curve = flat_curve()
    budgets = B(tokens_per_s=10_000.0)
    first = decide(fleet([]), curve, budgets, Counting(), Caps(), CFG)
    assert first.launches_allowed > 50
    # next tick: everything launched is still booting
    seeing = decide(
        fleet([], booting=first.launches_allowed), curve, budgets, Counting(), Caps(), CFG
    )
    assert seeing.launches_allowed <= 1
    blind = decide(fleet([]), curve, budgets, Counting(), Caps(), CFG)  # booting not reported
    assert blind.launches_allowed >= first.launches_allowed * 0.9  # would double the fleet


def test_young_fleet_of_a_growing_curve_projects_its_future_token_demand() -> None:
    """The trace curve's token rate grows with age: 100 tasks aged 0 s demand fewer tokens
    now than 100 tasks aged 6 min, and the projection over the horizon says so."""
    curve = default_curve()
    steady = steady_state(curve, Counting(), CFG.boot_s, CFG.integration_age_s)
    all_input = Counting(cached_input_counts=True)
    young = project(curve, np.zeros(100), all_input, CFG, steady, refill=0.0)
    old = project(curve, np.full(100, 360.0), all_input, CFG, steady, refill=0.0)
    assert young.live[Quantity.TOKENS][0] < old.live[Quantity.TOKENS][0]
    assert young.live[Quantity.TOKENS][-1] > young.live[Quantity.TOKENS][0]  # it grows


def test_stale_config_never_drives_the_ceiling_to_zero_with_work_queued() -> None:
    """Lesson: stale config. Budgets floored to almost nothing must not give a 0 ceiling."""
    tiny = B(calls_per_s=1e-6, tokens_per_s=1e-6, inflight_tokens=1e-6)
    d = decide(fleet([], stale=True), flat_curve(), tiny, Counting(), Caps(), CFG)
    assert d.binding is Binding.STALE_CONFIG
    assert d.ceiling >= 1 and d.launches_allowed >= 1
    floored = decide(
        fleet([], stale=True), flat_curve(), tiny, Counting(), Caps(), replace(CFG, stale_floor=7)
    )
    assert (floored.ceiling, floored.launches_allowed) == (7, 7)
    # with nothing queued there is nothing to launch
    empty = decide(fleet([], queued=0, stale=True), flat_curve(), tiny, Counting(), Caps(), CFG)
    assert empty.launches_allowed == 0 and empty.binding is Binding.NO_WORK


def test_a_budget_below_one_tasks_demand_still_gets_one_task_while_work_is_queued() -> None:
    """An operator's seed below what one task of the harness draws (0.1 output tokens/s where a
    task writes 10) sizes no fleet at all: nothing launched draws no answer to correct the
    seed, and the run never finishes. One task goes, its calls held to the budget by the
    pacer; the binding still names the budget."""
    low = B(tokens_per_s=1e9, calls_per_s=1e9, output_tokens_per_s=0.1)
    d = decide(fleet([]), flat_curve(), low, Counting(), Caps(), CFG)
    assert (d.ceiling, d.launches_allowed, d.binding) == (1, 1, Binding.ARRIVAL_BUDGET)
    assert d.saturating is Quantity.OUTPUT_TOKENS
    # a live task over the budget is not joined by another; none queued, none launched
    busy = decide(fleet([30.0]), flat_curve(), low, Counting(), Caps(), CFG)
    assert (busy.ceiling, busy.launches_allowed) == (1, 0)
    idle = decide(fleet([], queued=0), flat_curve(), low, Counting(), Caps(), CFG)
    assert (idle.ceiling, idle.launches_allowed, idle.binding) == (0, 0, Binding.NO_WORK)
    # an operator's override of 0 still stops launches
    held = decide(fleet([]), flat_curve(), low, Counting(), Caps(override=0), CFG)
    assert (held.ceiling, held.launches_allowed) == (0, 0)


def test_caps_bind_in_order_and_are_named() -> None:
    budgets = B(tokens_per_s=1e9, calls_per_s=1e9)
    curve = flat_curve()
    assert decide(fleet([]), curve, budgets, Counting(), Caps(static=40), CFG).binding is (
        Binding.AT_CAPACITY
    )
    d = decide(fleet([]), curve, budgets, Counting(), Caps(static=40, run=30), CFG)
    assert (d.binding, d.ceiling) == (Binding.RUN_CAP, 30)
    d = decide(fleet([]), curve, budgets, Counting(), Caps(static=40, run=30, override=5), CFG)
    assert (d.binding, d.ceiling, d.launches_allowed) == (Binding.CEILING_OVERRIDE, 5, 5)


def test_pause_cooldown_and_no_work_launch_nothing_and_kill_nothing() -> None:
    curve = flat_curve()
    ages = [10.0] * 20
    paused = decide(fleet(ages, paused=True), curve, B(), Counting(), Caps(), CFG)
    assert (paused.binding, paused.launches_allowed, paused.ceiling) == (Binding.PAUSED, 0, 20)
    cool = decide(fleet(ages, in_cooldown=True), curve, B(), Counting(), Caps(), CFG)
    assert (cool.binding, cool.launches_allowed, cool.ceiling) == (Binding.COOLDOWN, 0, 20)
    idle = decide(fleet(ages, queued=0), curve, B(), Counting(), Caps(), CFG)
    assert (idle.binding, idle.launches_allowed) == (Binding.NO_WORK, 0)


def test_launches_never_exceed_the_queue() -> None:
    d = decide(fleet([], queued=3), flat_curve(), B(), Counting(), Caps(), CFG)
    assert d.launches_allowed == 3


def test_over_budget_fleet_launches_nothing() -> None:
    d = decide(fleet([50.0] * 500), flat_curve(), B(tokens_per_s=1000.0), Counting(), Caps(), CFG)
    assert d.launches_allowed == 0 and d.ceiling < 500


def test_inflight_budget_bounds_the_fleet() -> None:
    d = decide(
        fleet([]),
        flat_curve(),
        B(tokens_per_s=1e9, calls_per_s=1e9, inflight_tokens=20_000.0),
        Counting(),
        Caps(),
        CFG,
    )
    assert d.binding is Binding.INFLIGHT_BUDGET
    assert d.ceiling <= 21  # 1000 in-flight tokens per running task


def test_call_rate_bound_names_qps_budget() -> None:
    # tokens would allow a huge fleet; calls/s cannot hold it at the pacer
    d = decide(
        fleet([]), flat_curve(), B(tokens_per_s=1e9, calls_per_s=2.0), Counting(), Caps(), CFG
    )
    assert d.binding is Binding.PACED and d.saturating is Quantity.CALLS
    young_callers = decide(
        fleet([1.0] * 100),
        flat_curve(calls=1.0),
        B(tokens_per_s=1e9, calls_per_s=10.0),
        Counting(),
        Caps(),
        CFG,
    )
    assert young_callers.launches_allowed == 0


def eager_start_curve() -> HarnessCurve:
    """A task that calls 4x faster in its first minute than after it (its first calls are
    short), with a long mean gap between calls (~89 s), so the calls bound is tight."""
    return HarnessCurve.from_params(
        {
            "format": 1,
            "harness": "eager-start",
            "rates": {
                "age_s": [0.0, 45.0, 60.0, 3600.0],
                "calls_per_s": [0.04, 0.04, 0.01, 0.01],
                "cached_input_tokens_per_s": [0.0] * 4,
                "uncached_input_tokens_per_s": [10.0] * 4,
                "output_tokens_per_s": [1.0] * 4,
                "inflight_tokens": [100.0] * 4,
                "inflight_calls": [0.1] * 4,
            },
            "survival": {"age_s": [0.0], "value": [1.0], "tail_s": 1200.0},
            "latency": {"base_s": 1.0, "per_output_token_s": 0.01},
        }
    )


def test_a_new_cohorts_first_calls_do_not_hold_the_fleet_under_a_calls_budget() -> None:
    """The calls bound is on the fleet's sustained demand once the new tasks have booted, not
    on the moment they all make their first calls together: a bound on that peak sized this
    fleet at 0.91x its budget, where the pacer held nothing back and the limit idled."""
    curve = eager_start_curve()
    steady = steady_state(curve, Counting(), CFG.boot_s, CFG.integration_age_s)
    budget = 2.6
    ages = np.linspace(300.0, 2400.0, 200)  # past their eager first minute: 0.01 calls/s
    d = decide(
        fleet(ages), curve, B(calls_per_s=budget, tokens_per_s=1e9), Counting(), Caps(), CFG, steady
    )
    proj = project(curve, ages, Counting(), CFG, steady, refill=1.0)
    q = Quantity.CALLS
    demand = proj.live[q] + d.launches_allowed * proj.per_new[q]
    booted = proj.per_new[q] > 0
    o_max = max(1.0 + CFG.max_wait_s / steady.mean_gap_s, CFG.overdrive)
    # saturated: the pacer has calls to hold back once the cohort runs ...
    assert float(demand[booted].mean()) >= budget
    # ... and no more than the wait bound allows, sustained
    assert float(demand[booted].mean()) <= o_max * budget * 1.001
    # the cohort's first minute goes above that bound for a while: the pacer's queue takes it
    assert float(demand.max()) > o_max * budget


def test_decision_record_is_frozen_and_checked() -> None:
    d = decide(fleet([], queued=5000), flat_curve(), B(), Counting(), Caps(), CFG)
    with pytest.raises(AttributeError):
        d.ceiling = 3  # type: ignore[misc]
    with pytest.raises(ValueError):
        Decision(
            now=0,
            live=5,
            booting=0,
            queued=1,
            ceiling=5,
            launches_allowed=1,
            binding=Binding.PACED,
            target=5,
            saturating=None,
        )
    row = d.as_row()
    assert row["binding"] == "paced" and set(row["projections"]) == {q.value for q in Quantity}


def test_bad_config_is_refused_naming_every_field() -> None:
    with pytest.raises(ConfigError, match="overdrive") as bad:
        SizingConfig(overdrive=0.9, age_bin_s=0.0, token_max_wait_s=1.0)
    assert [p.split(":")[0] for p in bad.value.problems] == [
        "overdrive",
        "token_max_wait_s",
        "age_bin_s",
    ]
    assert "got 0.9" in bad.value.problems[0]


def test_decision_for_10000_live_tasks_is_fast() -> None:
    """The speed figure is reported by `evalfleet bench planner --decision-speed`; this only
    guards against an accidental O(n x horizon) regression, with a generous tolerance."""
    curve = default_curve()
    steady = steady_state(curve, Counting(), CFG.boot_s, CFG.integration_age_s)
    ages = np.random.default_rng(1).uniform(0, 1500, 10_000)
    decide(fleet(ages), curve, B(), Counting(), Caps(), CFG, steady)
    started = time.perf_counter()
    for _ in range(5):
        decide(fleet(ages, booting=500), curve, B(), Counting(), Caps(), CFG, steady)
    assert (time.perf_counter() - started) / 5 < 0.2


FORBIDDEN = (
    "prefect",
    "sqlalchemy",
    "httpx",
    "requests",
    "aiohttp",
    "urllib",
    "socket",
    "os",
    "time",
    "redis",
    "psycopg",
    "boto3",
    "subprocess",
)
CLOCK_CALLS = ("now", "utcnow", "today", "monotonic", "perf_counter", "time_ns")


def test_planner_package_imports_no_io_no_clock_no_environment() -> None:
    """planner/ is pure: no Prefect, SQL, HTTP, environment or clock imports."""
    for path in sorted((ROOT / "planner").glob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"
            if isinstance(node, ast.Attribute) and node.attr == "environ":
                raise AssertionError(f"{path.name} reads an environment")
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in CLOCK_CALLS
                and not (isinstance(node.func.value, ast.Name) and node.func.value.id == "self")
            ):
                raise AssertionError(f"{path.name} reads the clock ({ast.unparse(node)})")


def test_endgame_launches_the_short_queue_at_once_within_the_longer_wait() -> None:
    curve = flat_curve()
    budgets = B(tokens_per_s=10_000.0)
    # the endgame's own bound, with a token budget sized as a calls budget would be
    flat = SizingConfig(boot_s=30.0, token_overdrive=1.1, token_max_wait_s=6.0)
    cfg = replace(flat, endgame_max_wait_s=12.0)
    steady = steady_state(curve, Counting(), cfg.boot_s, cfg.integration_age_s)
    # what is queued would take longer than the curve's tail to serve: size as usual
    normal = decide(fleet([], queued=1000), curve, budgets, Counting(), Caps(), cfg, steady)
    # 300 tasks x 30,000 tokens at 10,000/s = 900 s < tail age (~1170 s): endgame
    assert 300 * steady.task_totals["tokens_per_s"] / 10_000.0 < steady.tail_age_s
    end = decide(fleet([], queued=300), curve, budgets, Counting(), Caps(), cfg, steady)
    assert normal.launches_allowed < 150 < end.launches_allowed <= 300
    # bounded by the pacer wait allowed in the endgame: sustained demand <= (1 + wait/gap) x budget
    o_end = 1.0 + cfg.endgame_max_wait_s / steady.mean_gap_s
    assert end.launches_allowed * 100.0 <= o_end * 10_000.0 * 1.001
    capped = decide(fleet([], queued=300), curve, budgets, Counting(), Caps(), flat)
    assert normal.launches_allowed < capped.launches_allowed < end.launches_allowed


def test_endgame_waits_while_another_budget_could_not_serve_the_queue_within_the_tail() -> None:
    """The endgame launches the whole queue when what is left fits in about one long task's
    life at the budget. Old tasks whose contexts have grown make the token budget the one
    that saturates now, yet the queued tasks' output would take the output budget longer
    than the tail: launched at once, they form a cohort whose output the run then waits on
    (wide-1494: 271 tasks launched together, 1.21x its lower bound). So every budget must
    fit the queue within the tail, not only the one that saturates."""
    curve = HarnessCurve.from_params(
        {
            "format": 1,
            "harness": "growing",
            "rates": {
                "age_s": [0.0, 600.0],
                "calls_per_s": [0.2, 0.2],
                "cached_input_tokens_per_s": [0.0, 0.0],
                "uncached_input_tokens_per_s": [10.0, 1000.0],
                "output_tokens_per_s": [20.0, 20.0],
                "inflight_tokens": [1000.0, 1000.0],
                "inflight_calls": [0.2, 0.2],
            },
            "survival": {"age_s": [0.0], "value": [1.0], "tail_s": 300.0},
            "latency": {"base_s": 1.0, "per_output_token_s": 0.01},
        }
    )
    steady = steady_state(curve, Counting(), CFG.boot_s, CFG.integration_age_s)
    old = [550.0] * 100  # ~92k tokens/s projected: over the budget even at 2.5x it (75k)
    token_budget = 30_000.0

    def launches(output_budget: float, queued: int) -> Decision:
        budgets = B(tokens_per_s=token_budget, output_tokens_per_s=output_budget)
        return decide(fleet(old, queued=queued), curve, budgets, Counting(), Caps(), CFG, steady)

    # the most the token budget serves within the tail: the endgame's test on tokens holds
    queued = int(steady.tail_age_s * token_budget / steady.task_totals["tokens_per_s"])
    tight = launches(1_200.0, queued)
    assert tight.saturating is Quantity.TOKENS
    assert queued * steady.task_totals["output_tokens_per_s"] / 1_200.0 > steady.tail_age_s
    # sized as with a long queue, not launched at once
    assert tight.launches_allowed == launches(1_200.0, 10 * queued).launches_allowed
    assert tight.launches_allowed < queued / 10
    # with room for the queue's output too, the endgame launches it
    roomy = launches(50_000.0, queued)
    assert roomy.saturating is Quantity.TOKENS
    assert roomy.launches_allowed > 5 * tight.launches_allowed


def test_overdrive_controller_closes_the_utilisation_gap_and_stays_bounded() -> None:
    cfg = OverdriveConfig()
    factor = 1.0
    for _ in range(10):  # the fleet draws 85% of the budget: the multiplier grows
        factor = hold_overdrive(factor, 0.85, cfg)
    assert 1.3 < factor <= cfg.max_factor
    grown = factor
    for _ in range(5):  # a fully used budget: it eases back, never below min_factor
        factor = hold_overdrive(factor, 1.0, cfg)
    assert cfg.min_factor <= factor < grown
    for _ in range(200):
        factor = hold_overdrive(factor, 0.0, cfg)
    assert factor == cfg.max_factor
    for _ in range(500):
        factor = hold_overdrive(factor, 1.2, cfg)
    assert factor == cfg.min_factor
    with pytest.raises(ConfigError, match="max_factor: must be within"):
        OverdriveConfig(max_factor=0.9)


def test_a_stale_label_keeps_what_the_budgets_decided_for_the_saturation_controller() -> None:
    """A stale alias config labels every decision ``stale_config`` for a whole run; the
    sizing under the label is still the budgets' (``sized_by``), so the saturation controller
    keeps learning there — and does not when a cap, not the budgets, set the fleet."""
    budgets = B(tokens_per_s=2_000.0, calls_per_s=1e9)
    fresh = decide(fleet([]), flat_curve(), budgets, Counting(), Caps(), CFG)
    assert fresh.binding is Binding.PACED and fresh.sized_by is Binding.PACED
    stale = decide(fleet([], stale=True), flat_curve(), budgets, Counting(), Caps(), CFG)
    assert stale.binding is Binding.STALE_CONFIG and stale.sized_by is Binding.PACED
    assert fresh.feeds_saturation and stale.feeds_saturation
    capped = decide(fleet([], stale=True), flat_curve(), budgets, Counting(), Caps(static=2), CFG)
    assert capped.binding is Binding.STALE_CONFIG and capped.sized_by is Binding.AT_CAPACITY
    assert not capped.feeds_saturation
    cooling = decide(fleet([], in_cooldown=True), flat_curve(), budgets, Counting(), Caps(), CFG)
    assert cooling.binding is Binding.COOLDOWN and not cooling.feeds_saturation
    assert stale.as_row()["sized_by"] == "paced"


def narrow_curve() -> HarnessCurve:
    """A task that calls at a constant rate and ends at 500-600 s: its age says how near its
    end it is (90th over 50th percentile of its life about 1.07)."""
    params = flat_curve().to_params()
    params["survival"] = {"age_s": [0.0, 500.0, 600.0], "value": [1.0, 1.0, 0.01], "tail_s": 10.0}
    return HarnessCurve.from_params(params)


def test_old_tasks_go_first_at_the_pacer_unless_the_queue_is_dry_and_durations_narrow() -> None:
    """While instances are queued the output-bound pacer favours old tasks (they free slots);
    once every instance is live it does so only where durations spread wide, where an old task
    is a long one. For a narrow curve the old tasks are nearly done: arrival order."""
    budgets = B(output_tokens_per_s=100.0)
    ages = [10.0, 200.0, 450.0]

    def old_first(
        curve: HarnessCurve, cfg: SizingConfig = CFG, *, queued: int, booting: int = 0
    ) -> bool:
        steady = steady_state(curve, Counting(), cfg.boot_s, cfg.integration_age_s)
        state = fleet(ages, booting=booting, queued=queued)
        d = decide(state, curve, budgets, Counting(), Caps(), cfg, steady)
        return d.old_tasks_first

    assert steady_state(narrow_curve(), Counting(), 30.0, 7200.0).duration_spread < 1.2
    assert steady_state(flat_curve(), Counting(), 30.0, 7200.0).duration_spread > 3.0
    assert old_first(narrow_curve(), queued=5)
    assert old_first(narrow_curve(), queued=0, booting=2)  # the last launches are not live yet
    assert not old_first(narrow_curve(), queued=0)
    assert old_first(flat_curve(), queued=0)  # exponential lives: spread ln 10 / ln 2
    assert old_first(narrow_curve(), replace(CFG, old_first_min_spread=1.0), queued=0)


def test_the_instance_timeout_bounds_how_far_the_pacer_may_stretch_tasks() -> None:
    """Paced at its budget, a fleet sized ``x`` over it stretches each task ``x`` times: with a
    timeout, the curve's long tasks (survival 2%: 300 s x ln 50 = 1,174 s here) so stretched
    must end within ``timeout_margin`` of it, and the bound that cuts the fleet is named."""
    curve = flat_curve()
    budgets = B(tokens_per_s=10_000.0)
    tail = 300.0 * np.log(50.0)
    free = decide(fleet([]), curve, budgets, Counting(), Caps(), CFG)
    assert free.binding is Binding.PACED
    assert free.projections["tokens_per_s"] / 10_000.0 > 2.2
    # a long timeout bounds nothing
    loose = decide(
        replace(fleet([]), instance_timeout_s=20_000.0), curve, budgets, Counting(), Caps(), CFG
    )
    assert (loose.binding, loose.ceiling) == (free.binding, free.ceiling)
    # 0.8 x 2,200 s over a tail of 1,174 s: demand at most 1.5x the budget
    timeout = 1.5 * tail / CFG.timeout_margin
    bounded = decide(
        replace(fleet([]), instance_timeout_s=timeout), curve, budgets, Counting(), Caps(), CFG
    )
    assert bounded.binding is Binding.INSTANCE_TIMEOUT
    assert bounded.sized_by is Binding.INSTANCE_TIMEOUT
    assert 1.3 < bounded.projections["tokens_per_s"] / 10_000.0 <= 1.5 + 1e-6
    # a timeout shorter than the long tasks themselves: sized at the floor (1.1x the budget),
    # never below it, and at the budget with a floor of 1
    short = decide(
        replace(fleet([]), instance_timeout_s=0.5 * tail), curve, budgets, Counting(), Caps(), CFG
    )
    assert CFG.timeout_floor == 1.1
    assert short.binding is Binding.INSTANCE_TIMEOUT
    assert 1.0 < short.projections["tokens_per_s"] / 10_000.0 <= 1.1 + 1e-6
    assert short.launches_allowed > 0
    at_budget = decide(
        replace(fleet([]), instance_timeout_s=0.5 * tail),
        curve,
        budgets,
        Counting(),
        Caps(),
        replace(CFG, timeout_floor=1.0),
    )
    assert at_budget.ceiling < short.ceiling
    assert 0.9 < at_budget.projections["tokens_per_s"] / 10_000.0 <= 1.0 + 1e-6
    # a larger margin allows more
    wider = decide(
        replace(fleet([]), instance_timeout_s=timeout),
        curve,
        budgets,
        Counting(),
        Caps(),
        replace(CFG, timeout_margin=1.0),
    )
    assert bounded.ceiling < wider.ceiling <= free.ceiling
    with pytest.raises(ValueError, match="instance_timeout_s"):
        replace(fleet([]), instance_timeout_s=0.0)
    with pytest.raises(ConfigError, match="timeout_margin"):
        SizingConfig(timeout_margin=0.0)
    with pytest.raises(ConfigError, match="timeout_floor"):
        SizingConfig(timeout_floor=0.9)
