"""The planner tick on a real PostgreSQL ledger: the binding constraint is what the test set up,
the budget controller's state persists between ticks, a 429 of one type cuts only its budget,
spend errors pause the run with an audit row, operator edits re-seed the controller. The stored
state's JSON is ``test_plan_tick_state``'s, the provider's stated limits ``test_plan_tick_headers``';
the ledger fixtures and helpers are shared through ``plan_tick_support``."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

import numpy as np
import pytest
from sqlalchemy import Engine, Table, func, select
from sqlalchemy.orm import Session

from ledger import pacer_window
from ledger.controls import control_session, set_ceiling_override
from ledger.models import AuditLog, InstanceResult, PauseFlag, Run
from ledger.pacer_controls import rebase_pacer, set_pacer
from ledger.pauses import set_pause
from planner.budgets import BudgetClass
from planner.curves import DEFAULT_HARNESS
from tasks import plan
from tests import plan_tick_support
from tests.plan_tick_support import ALIAS, T0, add_calls, add_run, add_stated_limits, stored

pytestmark = pytest.mark.postgres

# the PostgreSQL ledger fixtures, shared through plan_tick_support
plan_db = plan_tick_support.plan_db
plan_ledger = plan_tick_support.plan_ledger


# ---------------------------------------------------------------------------------------------
# the binding constraint is what the test set up


def test_a_tiny_request_limit_stated_by_the_provider_binds_qps_budget(plan_ledger: Engine) -> None:
    add_run(plan_ledger, running=2, queued=20)
    add_stated_limits(plan_ledger, {"requests": 3.0})
    d = plan.plan_tick(T0, False)[ALIAS]
    assert d.binding.value == "qps_budget"
    assert d.budgets["calls_per_s"] == pytest.approx(3.0 / 60.0)
    assert d.launches_allowed == 0
    row = stored(plan_ledger)
    assert row.state.hard_caps[BudgetClass.REQUESTS] == pytest.approx(0.05)
    assert row.state.seed_source == "headers"


def test_a_per_run_cap_binds_run_cap(plan_ledger: Engine) -> None:
    add_run(plan_ledger, running=1, queued=30, task_cap=3)
    d = plan.plan_tick(T0, False)[ALIAS]
    assert (d.binding.value, d.ceiling, d.launches_allowed) == ("run_cap", 3, 2)


def test_an_alias_ceiling_override_binds(plan_ledger: Engine) -> None:
    add_run(plan_ledger, queued=30)
    with control_session(plan_ledger) as session:
        set_ceiling_override(session, "alias", ALIAS, 2, actor="t", reason="hold the alias")
    d = plan.plan_tick(T0, False)[ALIAS]
    assert (d.binding.value, d.ceiling) == ("ceiling_override", 2)


def test_the_shortest_instance_timeout_of_the_aliass_runs_bounds_the_sizing(
    plan_ledger: Engine,
) -> None:
    add_run(plan_ledger, queued=400)
    unbounded = plan.plan_tick(T0, False)[ALIAS]
    add_run(plan_ledger, queued=1, instance_timeout_s=86_400.0)
    add_run(plan_ledger, queued=1, instance_timeout_s=300.0)
    (fleet,) = plan.read_fleet(T0, False)
    assert fleet.instance_timeout_s == 300.0
    # the shipped curve's long tasks run far over 300 s / 0.8: sized at the budget, not over it
    bounded = plan.plan_tick(T0 + timedelta(seconds=15), False)[ALIAS]
    assert 0 < bounded.target < unbounded.target
    saturating = unbounded.saturating
    assert saturating is not None
    assert bounded.projections[saturating.value] <= bounded.budgets[saturating.value] * 1.0001


def test_the_ledger_pool_flag_and_the_prefect_pause_both_bind_paused(plan_ledger: Engine) -> None:
    add_run(plan_ledger, running=2, queued=30)
    assert plan.plan_tick(T0, False)[ALIAS].binding.value != "paused"
    d = plan.plan_tick(T0 + timedelta(seconds=15), True)[ALIAS]  # the Prefect pool's pause
    assert (d.binding.value, d.launches_allowed) == ("paused", 0)
    set_pause(plan_ledger, "pool", "harness", True, actor="t", reason="maintenance")
    d = plan.plan_tick(T0 + timedelta(seconds=30), False)[ALIAS]
    assert (d.binding.value, d.launches_allowed) == ("paused", 0)


def test_ages_are_the_current_attempts_harness_and_boot_times(plan_ledger: Engine) -> None:
    """A running task's age counts from its harness's start, not from the instance's first
    claim (a requeued instance starts over); a row from before that was recorded falls back to
    its first claim."""
    run_id = add_run(plan_ledger, running=2, booting=1, queued=5)
    first_claim = T0 - timedelta(hours=1)
    results = cast(Table, InstanceResult.__table__)
    with plan_ledger.begin() as conn:
        for instance, values in (
            # retried: claimed again 100 s ago, its harness started 40 s ago
            (
                "i0",
                {
                    "claimed_at": T0 - timedelta(seconds=100),
                    "running_at": T0 - timedelta(seconds=40),
                },
            ),
            # a row written before the attempt's times were kept
            ("i1", {"claimed_at": None, "running_at": None}),
            ("i2", {"claimed_at": T0 - timedelta(seconds=25), "running_at": None}),  # booting
        ):
            conn.execute(
                results.update()
                .where(results.c.run_id == run_id, results.c.instance_id == instance)
                .values(started_at=first_claim, **values)
            )
    (fleet,) = plan.read_fleet(T0, False)
    assert sorted(fleet.ages.tolist()) == pytest.approx([40.0, 3600.0])
    assert fleet.booting == 1


def test_booting_tasks_count_as_live(plan_ledger: Engine) -> None:
    add_run(plan_ledger, running=2, booting=3, queued=10, task_cap=5)
    d = plan.plan_tick(T0, False)[ALIAS]
    assert (d.live, d.booting, d.launches_allowed) == (5, 3, 0)


# ---------------------------------------------------------------------------------------------
# the controller across ticks


def test_a_429_of_one_type_cuts_only_that_budget_across_ticks(plan_ledger: Engine) -> None:
    add_run(plan_ledger, running=3, queued=30)
    first = plan.plan_tick(T0, False)[ALIAS]
    calls0, tokens0 = first.budgets["calls_per_s"], first.budgets["tokens_per_s"]

    add_calls(plan_ledger, 3, status=429, limit_type="requests")
    t1 = T0 + timedelta(seconds=15)
    d1 = plan.plan_tick(t1, False)[ALIAS]
    assert d1.budgets["calls_per_s"] == pytest.approx(calls0 * 0.75)
    assert d1.budgets["tokens_per_s"] == pytest.approx(tokens0)
    assert d1.binding.value == "cooldown" and d1.launches_allowed == 0
    saved = stored(plan_ledger)
    assert saved.state.budgets.calls_per_s == pytest.approx(calls0 * 0.75)
    assert saved.tick_at == t1

    # more 429s of calls sent before the cut, inside the cooldown: no second cut
    add_calls(plan_ledger, 2, status=429, limit_type="requests")
    d2 = plan.plan_tick(t1 + timedelta(seconds=15), False)[ALIAS]
    assert d2.budgets["calls_per_s"] == pytest.approx(calls0 * 0.75)

    # a token 429 later cuts the token budget and leaves the request budget where it was
    add_calls(plan_ledger, 1, status=429, limit_type="tokens")
    d3 = plan.plan_tick(t1 + timedelta(seconds=60), False)[ALIAS]
    assert d3.budgets["tokens_per_s"] == pytest.approx(tokens0 * 0.75)
    assert d3.budgets["calls_per_s"] == pytest.approx(calls0 * 0.75)
    assert d3.budgets["inflight_tokens"] == pytest.approx(first.budgets["inflight_tokens"])

    # a restarted loop (fresh process caches) continues from the ledger's state
    plan.curve_cache.cache_clear()
    d4 = plan.plan_tick(t1 + timedelta(seconds=75), False)[ALIAS]
    assert d4.budgets["tokens_per_s"] == pytest.approx(tokens0 * 0.75)
    assert d4.binding.value == "cooldown"


def test_a_per_day_limits_429_backs_off_and_cuts_nothing(plan_ledger: Engine) -> None:
    """An OpenAI TPD/RPD 429 says a per-day limit ran out: cutting the per-minute budgets (as
    a plain token 429 would, every cooldown while the day's quota lasts) would leave them at
    their floor when it resets. The tick freezes launches instead and cuts nothing."""
    add_run(plan_ledger, running=3, queued=30)
    first = plan.plan_tick(T0, False)[ALIAS]
    add_calls(plan_ledger, 4, status=429, limit_type="daily")
    for k in (1, 2, 3):  # three ticks: 45 s, past one cooldown
        d = plan.plan_tick(T0 + timedelta(seconds=15 * k), False)[ALIAS]
        if k == 1:
            assert d.binding.value == "cooldown" and d.launches_allowed == 0
        add_calls(plan_ledger, 2, status=429, limit_type="daily", at=T0 + timedelta(seconds=15 * k))
    assert d.budgets == first.budgets  # nothing cut
    assert d.binding.value == "cooldown"
    saved = stored(plan_ledger)
    assert saved.state.last_429_level == {} and saved.state.cuts_below_seed == {}


def test_a_429_persisting_through_the_cooldown_cuts_to_what_the_provider_accepted(
    plan_ledger: Engine,
) -> None:
    """The provider's token limit dropped: the first cut (x0.75) is not enough, 429s go on
    through the cooldown, and the second cut reads what the provider accepted meanwhile from
    the gateway's successful calls (their counted tokens over the cooldown)."""
    add_run(plan_ledger, running=3, queued=30)
    first = plan.plan_tick(T0, False)[ALIAS]
    tokens0 = first.budgets["tokens_per_s"]
    add_calls(plan_ledger, 2, status=429, limit_type="tokens")
    t1 = T0 + timedelta(seconds=15)
    assert plan.plan_tick(t1, False)[ALIAS].budgets["tokens_per_s"] == pytest.approx(tokens0 * 0.75)
    # over the next 30 s the provider answered 30 calls of 13,000 input tokens: ~13,000/s
    # (each answered 1 s after its request)
    t3 = t1 + timedelta(seconds=30)
    for i in range(30):
        add_calls(plan_ledger, 1, at=t1 + timedelta(seconds=i - 0.5), tokens=13_000)
    add_calls(plan_ledger, 1, status=429, limit_type="tokens", at=t3 - timedelta(seconds=1))
    d3 = plan.plan_tick(t3, False)[ALIAS]
    combined = stored(plan_ledger).state.token_class == "combined"
    accepted = 13_100.0 if combined else 13_000.0  # a combined class counts the 100 output
    # so the measurement decides: below another x0.75, above the floor of two blind cuts
    assert tokens0 * 0.75**3 < accepted * 0.95 < tokens0 * 0.75 * 0.75
    assert d3.budgets["tokens_per_s"] == pytest.approx(accepted * 0.95, rel=0.01)
    assert d3.budgets["calls_per_s"] == pytest.approx(first.budgets["calls_per_s"])


def test_a_clean_busy_window_grows_the_budgets(plan_ledger: Engine) -> None:
    """Every clean budget grows (``grow_min_utilisation`` is 0: budgets held near their use
    would all look pressed to an unknown 429); use matters only to a re-base up (rule 7)."""
    add_run(plan_ledger, running=3, queued=30)
    first = plan.plan_tick(T0, False)[ALIAS]
    # 15 s at 9 calls/s: the request budget is fully used; tokens far below their budget
    add_calls(plan_ledger, 135, tokens=10)
    d = plan.plan_tick(T0 + timedelta(seconds=15), False)[ALIAS]
    assert d.budgets["calls_per_s"] == pytest.approx(first.budgets["calls_per_s"] * 1.05)
    assert d.budgets["tokens_per_s"] == pytest.approx(first.budgets["tokens_per_s"] * 1.05)


def test_a_seed_far_below_one_served_call_is_lifted_to_that_call_a_minute(
    plan_ledger: Engine,
) -> None:
    """Rule 8 through the ledger: an operator re-bases the token seed to 10/s (a typo), then
    one call of 60,000 tokens is served whole; the provider's per-minute bucket held it, so the
    next tick budgets that call a minute (not +5% a window from 10/s, a call per 100 minutes)."""
    add_run(plan_ledger, running=1, queued=10)
    plan.plan_tick(T0, False)
    alias = plan.aliases().get(ALIAS)
    with Session(plan_ledger) as session, session.begin():
        rebase_pacer(session, alias, {"tokens_per_s": 10.0}, now=T0, actor="op", reason="typo")
    plan.plan_tick(T0 + timedelta(seconds=15), False)
    add_calls(plan_ledger, 1, tokens=60_000, at=T0 + timedelta(seconds=20))

    d = plan.plan_tick(T0 + timedelta(seconds=30), False)[ALIAS]

    state = stored(plan_ledger).state
    counted = 60_000 + (100 if state.token_class == "combined" else 0)
    assert d.budgets["tokens_per_s"] == pytest.approx(counted / 60.0)
    assert state.seed.tokens_per_s == pytest.approx(counted / 60.0)


def test_a_spend_error_pauses_the_run_with_an_audit_row(plan_ledger: Engine) -> None:
    run_id = add_run(plan_ledger, running=1, queued=5)
    other = add_run(plan_ledger, running=1, queued=5)
    plan.plan_tick(T0, False)
    add_calls(plan_ledger, 2, status=402, limit_type="spend", run_id=run_id)
    plan.plan_tick(T0 + timedelta(seconds=15), False)
    with plan_ledger.connect() as conn:
        flags = conn.execute(
            select(PauseFlag.target).where(PauseFlag.scope == "run", PauseFlag.paused.is_(True))
        ).scalars()
        assert set(flags) == {run_id}
        audits = conn.execute(
            select(AuditLog.actor, AuditLog.action, AuditLog.reason).where(
                AuditLog.target == f"run:{run_id}"
            )
        ).all()
    assert len(audits) == 1 and audits[0][:2] == ("planner", "pause")
    assert "spend" in audits[0][2]
    # the next tick does not pause it again (one audit row), the other run is untouched
    plan.plan_tick(T0 + timedelta(seconds=30), False)
    with plan_ledger.connect() as conn:
        n = conn.execute(
            select(func.count()).select_from(AuditLog).where(AuditLog.actor == "planner")
        ).scalar_one()
        other_paused = conn.execute(
            select(func.count()).select_from(PauseFlag).where(PauseFlag.target == other)
        ).scalar_one()
    assert (n, other_paused) == (1, 0)


def test_an_operator_edit_reseeds_the_controller(plan_ledger: Engine) -> None:
    add_run(plan_ledger, running=1, queued=10)
    assert plan.plan_tick(T0, False)[ALIAS].budgets["calls_per_s"] == pytest.approx(9.0)
    alias = plan.aliases().get(ALIAS)
    with Session(plan_ledger) as session, session.begin():
        set_pacer(
            session, alias, {"calls_per_s": 2.0}, now=T0, actor="op", reason="provider cut us"
        )
    d = plan.plan_tick(T0 + timedelta(seconds=15), False)[ALIAS]
    assert d.budgets["calls_per_s"] == pytest.approx(2.0)
    assert stored(plan_ledger).config_version == 1


def test_a_stale_config_says_so_and_keeps_work_moving_until_headers_reseed_it(
    plan_ledger: Engine,
) -> None:
    add_run(plan_ledger, queued=10)
    alias = plan.aliases().get(ALIAS)
    with Session(plan_ledger) as session, session.begin():
        set_pacer(
            session,
            alias,
            {"calls_per_s": 0.001},  # far below anything useful, seeded 7 h ago
            now=T0 - timedelta(hours=7),
            actor="op",
            reason="old limit",
        )
    d = plan.plan_tick(T0, False)[ALIAS]
    assert d.binding.value == "stale_config" and d.stale
    assert d.ceiling >= 1 and d.launches_allowed >= 1  # never 0 while work is queued
    add_stated_limits(
        plan_ledger, {"requests": 300.0, "tokens": 1_200_000.0}, at=T0 + timedelta(seconds=5)
    )
    d = plan.plan_tick(T0 + timedelta(seconds=15), False)[ALIAS]
    assert not d.stale and d.binding.value != "stale_config"
    assert d.budgets["calls_per_s"] == pytest.approx(5.0)
    assert stored(plan_ledger).state.seed_source == "headers"


def test_pacer_waits_lower_the_fleets_progress_and_it_persists(plan_ledger: Engine) -> None:
    add_run(plan_ledger, running=6, queued=30)
    plan.plan_tick(T0, False)
    assert stored(plan_ledger).progress == 1.0
    add_calls(plan_ledger, 20, pacer_wait_s=20.0)  # every call waited 20 s at the pacer
    plan.plan_tick(T0 + timedelta(seconds=30), False)
    first = stored(plan_ledger).progress
    assert 0.05 <= first < 1.0
    add_calls(plan_ledger, 20, pacer_wait_s=20.0)
    plan.plan_tick(T0 + timedelta(seconds=45), False)
    second = stored(plan_ledger).progress
    assert second < first  # smoothed: it keeps moving toward the measured stretch
    add_calls(plan_ledger, 20, pacer_wait_s=0.0)  # calls that did not wait pull it back up
    plan.plan_tick(T0 + timedelta(seconds=60), False)
    assert stored(plan_ledger).progress > second


def test_an_overload_backs_off_launches_and_cuts_no_budget(plan_ledger: Engine) -> None:
    add_run(plan_ledger, running=2, queued=30)
    first = plan.plan_tick(T0, False)[ALIAS]
    add_calls(plan_ledger, 3, status=529, limit_type="overload")
    d = plan.plan_tick(T0 + timedelta(seconds=15), False)[ALIAS]
    assert (d.binding.value, d.launches_allowed) == ("cooldown", 0)
    assert dict(d.budgets) == dict(first.budgets)
    assert stored(plan_ledger).state.backoff_until > (T0 + timedelta(seconds=15)).timestamp()


def test_a_mixed_curve_weights_its_harnesses_by_share() -> None:
    from planner.curves import HarnessCurve, default_curve

    base = default_curve()
    params = base.to_params()
    params["harness"] = "heavy"
    for key in ("cached_input_tokens_per_s", "uncached_input_tokens_per_s"):
        params["rates"][key] = [3 * v for v in params["rates"][key]]
    heavy = HarnessCurve.from_params(params)
    age = np.array([0.0, 60.0, 240.0])
    same = plan.MixedCurve([(1.0, base), (3.0, base)])
    np.testing.assert_allclose(same.calls_per_s(age), base.calls_per_s(age))
    np.testing.assert_allclose(same.survival(age), base.survival(age))
    mix = plan.MixedCurve([(1.0, base), (1.0, heavy)])
    np.testing.assert_allclose(
        mix.uncached_input_tokens_per_s(age), 2 * base.uncached_input_tokens_per_s(age)
    )


def test_an_alias_shared_by_two_harnesses_is_sized_on_their_mix(plan_ledger: Engine) -> None:
    from ledger.curves import write_curve
    from planner.curves import HarnessCurve, default_curve

    params = default_curve().to_params()
    params["harness"] = "heavy"
    for key in ("cached_input_tokens_per_s", "uncached_input_tokens_per_s"):
        params["rates"][key] = [3 * v for v in params["rates"][key]]
    write_curve(
        plan_ledger, HarnessCurve.from_params(params), sample_count=1, fit_quality={}, source="t"
    )
    add_run(plan_ledger, running=2, queued=20)  # harness mini-swe-agent: the default curve
    run_id = add_run(plan_ledger, running=2, queued=20)
    light = plan.plan_tick(T0, False)[ALIAS]
    with plan_ledger.begin() as conn:
        runs = cast(Table, Run.__table__)
        conn.execute(runs.update().where(Run.id == run_id).values(harness="heavy"))
    fleet = plan.read_fleet(T0, False)[0]
    assert dict(fleet.work) == {"heavy": 22, DEFAULT_HARNESS: 22}
    assert isinstance(plan._fleet_curve(fleet), plan.MixedCurve)
    mixed = plan.plan_tick(T0, False)[ALIAS]
    # half the fleet asks for 3x the input tokens: the same budget holds fewer tasks
    assert light.binding.value == mixed.binding.value == "paced"
    assert mixed.target < light.target


def test_an_unknown_429_is_blamed_on_the_drained_rates_the_ledger_gives(
    plan_ledger: Engine,
) -> None:
    """A 429 that names no limit: the blame reads how fast each bucket was drained
    (``ledger.pacer_window.drained_rates``), not the burst over the last cooldown, and keeps
    them as the episode's sample for the steadiness rule."""
    add_run(plan_ledger, running=3, queued=30)
    plan.plan_tick(T0, False)
    for i in range(30):
        add_calls(plan_ledger, 1, at=T0 + timedelta(seconds=1 + i / 3), tokens=2_000)
    add_calls(plan_ledger, 1, status=429, limit_type=None, at=T0 + timedelta(seconds=12))
    t1 = T0 + timedelta(seconds=15)
    plan.plan_tick(t1, False)
    state = stored(plan_ledger).state
    with plan_ledger.connect() as conn:
        drained = pacer_window.drained_rates(
            conn,
            ALIAS,
            t1,
            token_class=state.token_class,
            cached_input_counts=state.cached_input_counts,
        ).rates
    [(at, rates)] = state.unknown_samples
    assert at == t1.timestamp()
    assert rates[BudgetClass.REQUESTS] == pytest.approx(30 / (60.0 + 14.0))  # not 30 / 30 s
    assert dict(rates) == pytest.approx({c: v for c, v in drained.items() if c in rates})


def test_a_wrong_cache_belief_without_headers_flips_on_the_drained_token_rates(
    plan_ledger: Engine,
) -> None:
    """No header states the token bucket. The alias believes cache reads count; at each tick's
    429 that names no limit the provider had served 150k uncached tokens over the minute,
    while the cache reads (and with them the believed count) grew as the tasks aged, and the
    request count moved with the calls' sizes. Steady only the other way: after four such
    ticks (``DrainBeliefConfig.samples``) the belief flips, and the token budget goes to what
    the uncached count drained (``planner.drain_belief``)."""
    add_run(plan_ledger, running=3, queued=30)
    plan.plan_tick(T0, False)
    assert stored(plan_ledger).state.cached_input_counts
    calls = [20, 30, 40, 30]
    tick_at = T0
    for k, n in enumerate(calls):
        assert stored(plan_ledger).state.cached_input_counts  # not before the fourth
        tick_at = T0 + timedelta(seconds=700.0 * (k + 1))  # each tick's calls alone in view
        uncached = 150_000 // n
        add_calls(
            plan_ledger,
            n,
            at=tick_at - timedelta(seconds=1),
            tokens=uncached * (k + 2),
            cached=uncached * (k + 1),
        )
        add_calls(plan_ledger, 1, status=429, limit_type=None, at=tick_at - timedelta(seconds=0.5))
        plan.plan_tick(tick_at, False)
    state = stored(plan_ledger).state
    assert not state.cached_input_counts
    # drained from a full bucket over one second: the calls' uncached tokens and output / 61 s
    measured = (150_000 + 100 * 30) / 61.0
    assert state.seed.tokens_per_s == pytest.approx(measured, rel=0.02)
    assert state.budgets.tokens_per_s <= state.seed.tokens_per_s * 1.05


@pytest.mark.parametrize("stated", [True, False], ids=["headers", "no-headers"])
def test_an_in_flight_seed_that_sizes_the_fleet_is_re_based_up_through_the_ledger(
    plan_ledger: Engine, stated: bool
) -> None:
    """``planner.inflight_use`` through the ledger: an operator sets the in-flight seed far
    below what the fleet needs, so the previous decision's fleet is sized by it, while the
    calls hold it at a few percent on average. Where the provider states its limits, it counts
    as used in full and the seed is re-based up once held at 1.5x it (rule 7); read as the
    calls' mean in-flight, as without headers (the rate budgets are guesses there), it is not."""
    add_run(plan_ledger, running=2, queued=200)
    plan.plan_tick(T0, False)
    alias = plan.aliases().get(ALIAS)
    with Session(plan_ledger) as session, session.begin():
        rebase_pacer(session, alias, {"inflight_tokens": 3_000.0}, now=T0, actor="op", reason="low")
    if stated:  # after the re-base, which starts the controller afresh
        add_stated_limits(plan_ledger, {"requests": 6_000.0}, at=T0 + timedelta(seconds=5))
    bindings = []
    for tick in range(1, 30):
        at = T0 + timedelta(seconds=15 * tick)
        add_calls(plan_ledger, 2, tokens=1_000, at=at - timedelta(seconds=5))
        bindings.append(plan.plan_tick(at, False)[ALIAS].binding)
    assert bindings[0] == "inflight_budget"
    state = stored(plan_ledger).state
    assert state.seed.inflight_tokens is not None
    if stated:
        assert state.seed.inflight_tokens > 3_000.0 * 1.4
    else:
        assert state.seed.inflight_tokens == pytest.approx(3_000.0)
