"""The planner tick on a real PostgreSQL ledger: the binding constraint is what the test set up,
the budget controller's state persists between ticks, a 429 of one type cuts only its budget,
spend errors pause the run with an audit row, operator edits re-seed the controller."""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import numpy as np
import psycopg
import pytest
from sqlalchemy import Engine, delete, func, insert, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from evalfleet.errors import ConfigError
from evalfleet.settings import get_settings
from ledger import pacer_state, pacer_window
from ledger.controls import control_session, set_ceiling_override
from ledger.db import make_engine
from ledger.migrate import upgrade
from ledger.models import (
    AliasObservation,
    AuditLog,
    InstanceResult,
    Job,
    LlmCall,
    PauseFlag,
    Run,
)
from ledger.pacer_controls import set_pacer
from ledger.pauses import set_pause
from planner.budgets import BudgetClass, Budgets, initial_state
from planner.classify import LimitType
from planner.curves import DEFAULT_HARNESS
from tasks import ledger_io, plan

pytestmark = pytest.mark.postgres

ALIAS = "sim-openai"  # embedded default: 9 calls/s, 27k tokens/s, cooldown 30 s
T0 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def _admin(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


_TABLES = (
    "jobs",
    "instance_results",
    "llm_calls",
    "planner_decisions",
    "pacer_states",
    "pacer_config_history",
    "pacer_configs",
    "pause_flags",
    "alias_observations",
    "alias_controls",
    "runs",
)


@pytest.fixture(scope="module")
def plan_db(pg_database: str) -> Iterator[str]:
    """One fresh migrated PostgreSQL ledger for this module."""
    name = f"{make_url(pg_database).database}_plan_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(_admin(pg_database), autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(pg_database).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    yield url
    with psycopg.connect(_admin(pg_database), autocommit=True, connect_timeout=5) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def plan_ledger(plan_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    """The module's ledger, emptied (the append-only audit log aside), as ``tasks.ledger_io``'s."""
    eng = make_engine(plan_db)
    with eng.begin() as conn:
        conn.exec_driver_sql(f"TRUNCATE {', '.join(_TABLES)} RESTART IDENTITY CASCADE")
    monkeypatch.setenv("EVALFLEET_DATABASE_URL", plan_db)
    monkeypatch.delenv("EVALFLEET_ALIASES_FILE", raising=False)
    get_settings.cache_clear()
    ledger_io.engine.cache_clear()
    ledger_io.sessions.cache_clear()
    yield eng
    eng.dispose()
    ledger_io.engine().dispose()
    ledger_io.engine.cache_clear()
    ledger_io.sessions.cache_clear()
    get_settings.cache_clear()


def add_run(
    eng: Engine,
    *,
    running: int = 0,
    booting: int = 0,
    queued: int = 0,
    task_cap: int | None = None,
    alias: str = ALIAS,
    now: datetime = T0,
) -> str:
    """A running run with ``running`` tasks (ages 30 s apart), ``booting`` ones, queued jobs."""
    run_id = str(uuid.uuid4())
    with eng.begin() as conn:
        conn.execute(
            insert(Run).values(
                id=run_id,
                name="plan-test",
                harness=DEFAULT_HARNESS,  # sized on the shipped curve of the real traces
                alias=alias,
                state="running",
                task_cap=task_cap,
                spend_cap_micro_usd=10**9,
                max_attempts=3,
                config={},
            )
        )
        rows = []
        for k in range(running):
            rows.append(("running", now - timedelta(seconds=30 * k)))
        rows += [("booting", None)] * booting
        rows += [("queued", None)] * queued
        for i, (state, started) in enumerate(rows):
            conn.execute(
                insert(InstanceResult).values(
                    run_id=run_id,
                    instance_id=f"i{i}",
                    state=state,
                    started_at=started,
                    lease_token=None if state == "queued" else "lease",
                )
            )
            conn.execute(
                insert(Job).values(
                    run_id=run_id,
                    instance_id=f"i{i}",
                    visible_at=now,
                    lease_token=None if state == "queued" else "lease",
                )
            )
    return run_id


def add_calls(
    eng: Engine,
    n: int,
    *,
    status: int = 200,
    limit_type: str | None = None,
    run_id: str | None = None,
    at: datetime = T0,
    tokens: int = 1000,
    pacer_wait_s: float = 0.0,
) -> None:
    with eng.begin() as conn:
        conn.execute(
            insert(LlmCall),
            [
                {
                    "run_id": run_id,
                    "alias": ALIAS,
                    "requested_at": at,
                    "input_tokens": tokens if status == 200 else 0,
                    "output_tokens": 100 if status == 200 else 0,
                    "status": status,
                    "limit_type": limit_type,
                    "latency_s": 1.0,
                    "pacer_wait_s": pacer_wait_s,
                }
                for _ in range(n)
            ],
        )


def add_stated_limits(eng: Engine, limits: dict[str, float], at: datetime | None = None) -> None:
    """A response whose rate-limit headers stated ``limits`` (per minute), 5 s before T0."""
    with eng.begin() as conn:
        conn.execute(
            insert(AliasObservation).values(
                alias=ALIAS,
                observed_at=at or T0 - timedelta(seconds=5),
                status=200,
                headers={},
                limits={"limits": limits, "remaining": {}},
            )
        )


def stored(eng: Engine) -> pacer_state.StoredState:
    with eng.connect() as conn:
        s = pacer_state.load_state(conn, ALIAS)
    assert s is not None
    return s


# ---------------------------------------------------------------------------------------------
# the persisted state


def test_state_round_trips_through_json_without_infinities() -> None:
    seed = Budgets(
        calls_per_s=9.0, tokens_per_s=27_000.0, output_tokens_per_s=None, inflight_tokens=4e5
    )
    state = initial_state(seed, 100.0, cached_input_counts=True, token_class="combined")
    assert math.isinf(state.cooldown_until)
    data = pacer_state.state_to_json(state)
    assert data["cooldown_until"] is None
    assert pacer_state.state_from_json(data, source="t") == state
    from dataclasses import replace

    busy = replace(
        state,
        cooldown_until=130.0,
        last_429_level={BudgetClass.REQUESTS: 9.0},
        last_429_at={BudgetClass.REQUESTS: 100.0},
        cuts_below_seed={BudgetClass.TOKENS: (90.0, 95.0)},
        hard_caps={BudgetClass.REQUESTS: 8.0},
        observed={BudgetClass.REQUESTS: 8.0},
        observed_at=99.0,
        at_ceiling_since={BudgetClass.INFLIGHT: 97.0},
        at_ceiling_used_s={BudgetClass.INFLIGHT: 2.5},
        unknown_samples=((98.0, {BudgetClass.TOKENS: 21_000.0, BudgetClass.REQUESTS: 7.5}),),
        share_rebased_at={BudgetClass.TOKENS: 95.0},
        level_memory_s={BudgetClass.REQUESTS: 2400.0},
        rebase_up_streak={BudgetClass.TOKENS: 2},
    )
    assert pacer_state.state_from_json(pacer_state.state_to_json(busy), source="t") == busy
    # a state saved before the re-base-up rule (or the steadiest-class blame) lacks their fields
    old = pacer_state.state_to_json(state)
    for key in (
        "at_ceiling_since",
        "at_ceiling_used_s",
        "unknown_samples",
        "share_rebased_at",
        "level_memory_s",
        "rebase_up_streak",
    ):
        del old[key]
    assert pacer_state.state_from_json(old, source="t") == state


def test_a_malformed_stored_state_is_a_config_error_naming_the_field() -> None:
    seed = Budgets(
        calls_per_s=9.0, tokens_per_s=27_000.0, output_tokens_per_s=None, inflight_tokens=4e5
    )
    data = pacer_state.state_to_json(
        initial_state(seed, 100.0, cached_input_counts=True, token_class="combined")
    )
    data["budgets"]["calls_per_s"] = -1.0
    data["token_class"] = "bytes"
    data["unknown_samples"] = [
        {"at": 1.0, "rates": {"tokens": 5.0}},
        {"at": 2.0, "rates": {"x": 1}},
    ]
    with pytest.raises(ConfigError) as err:
        pacer_state.state_from_json(data, source="pacer_states 'x'")
    text = str(err.value)
    assert "budgets.calls_per_s" in text and "token_class" in text and "pacer_states" in text
    assert "unknown_samples[1].rates.x" in text and "unknown_samples[0]" not in text


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


def test_the_ledger_pool_flag_and_the_prefect_pause_both_bind_paused(plan_ledger: Engine) -> None:
    add_run(plan_ledger, running=2, queued=30)
    assert plan.plan_tick(T0, False)[ALIAS].binding.value != "paused"
    d = plan.plan_tick(T0 + timedelta(seconds=15), True)[ALIAS]  # the Prefect pool's pause
    assert (d.binding.value, d.launches_allowed) == ("paused", 0)
    set_pause(plan_ledger, "pool", "harness", True, actor="t", reason="maintenance")
    d = plan.plan_tick(T0 + timedelta(seconds=30), False)[ALIAS]
    assert (d.binding.value, d.launches_allowed) == ("paused", 0)


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
    # over the next 30 s the provider accepted 30 calls of 13,000 input tokens: ~13,000/s
    t3 = t1 + timedelta(seconds=30)
    for i in range(30):
        add_calls(plan_ledger, 1, at=t1 + timedelta(seconds=i + 0.5), tokens=13_000)
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
        conn.execute(Run.__table__.update().where(Run.id == run_id).values(harness="heavy"))
    fleet = plan.read_fleet(T0, False)[0]
    assert dict(fleet.work) == {"heavy": 22, DEFAULT_HARNESS: 22}
    assert isinstance(plan._fleet_curve(fleet), plan.MixedCurve)
    mixed = plan.plan_tick(T0, False)[ALIAS]
    # half the fleet asks for 3x the input tokens: the same budget holds fewer tasks
    assert light.binding.value == mixed.binding.value == "paced"
    assert mixed.target < light.target


# ---------------------------------------------------------------------------------------------
# a limit only a 429 states reaches the planner, though a success's headers came after it


def test_a_limit_only_a_429_states_survives_later_successes(plan_ledger: Engine) -> None:
    from gateway.recorder import CallRecorder, Observation

    recorder = CallRecorder(sessionmaker(plan_ledger))
    limited_at = T0 - timedelta(seconds=8)
    headers = {"x-ratelimit-limit-requests": "4000"}
    throttle = Observation(
        alias=ALIAS,
        observed_at=limited_at,
        status=429,
        headers=headers,
        # an OpenAI 429 whose message states an output-token limit its headers do not
        limits={"limits": {"requests": 4000.0, "output_tokens": 90000.0}, "remaining": {}},
        last_limit_type="output_tokens",
        last_limited_at=limited_at,
        throttle_limits={"requests": 4000.0, "output_tokens": 90000.0},
    )

    def success(at: datetime) -> Observation:
        return Observation(alias=ALIAS, observed_at=at, status=200, headers=headers, limits={})

    async def record() -> None:
        recorder.observe(throttle)
        await recorder.flush()
        recorder.observe(success(T0 - timedelta(seconds=5)))  # written over the 429's row
        await recorder.flush()

    asyncio.run(record())
    with plan_ledger.connect() as conn:
        row = conn.execute(select(AliasObservation).where(AliasObservation.alias == ALIAS)).one()
        since_before = pacer_window.fresh_header_limits(conn, ALIAS, T0 - timedelta(seconds=15))
        since_after = pacer_window.fresh_header_limits(conn, ALIAS, T0 - timedelta(seconds=6))
    assert row.status == 200 and row.last_limit_type == "output_tokens"
    assert since_before == {LimitType.REQUESTS: 4000.0, LimitType.OUTPUT_TOKENS: 90000.0}
    # a tick after the 429 was stepped sees only what the latest headers state
    assert since_after == {LimitType.REQUESTS: 4000.0}

    # a restarted gateway's first success keeps the ledger's 429 too
    restarted = CallRecorder(sessionmaker(plan_ledger))
    restarted.observe(success(T0 - timedelta(seconds=4)))
    asyncio.run(restarted.flush())
    with plan_ledger.connect() as conn:
        row = conn.execute(select(AliasObservation).where(AliasObservation.alias == ALIAS)).one()
        after_restart = pacer_window.fresh_header_limits(conn, ALIAS, T0 - timedelta(seconds=15))
    assert row.last_limit_type == "output_tokens" and after_restart == since_before

    # the same within one flush interval: the success replaces the 429 before any write
    recorder.observe(replace(throttle, observed_at=T0, last_limited_at=T0))
    recorder.observe(success(T0 + timedelta(seconds=1)))
    asyncio.run(recorder.flush())
    with plan_ledger.connect() as conn:
        limits = pacer_window.fresh_header_limits(conn, ALIAS, T0 - timedelta(seconds=1))
    assert limits is not None and limits[LimitType.OUTPUT_TOKENS] == 90000.0


# ---------------------------------------------------------------------------------------------
# the provider's stated bucket against the cache-counting belief


def _observe_bucket(eng: Engine, at: datetime, remaining: float) -> None:
    """The gateway's latest headers: a combined 1.62M tokens/min limit with ``remaining``."""
    values = {
        "observed_at": at,
        "status": 200,
        "headers": {},
        "limits": {"limits": {"tokens": 1_620_000.0}, "remaining": {"tokens": remaining}},
    }
    with eng.begin() as conn:
        conn.execute(delete(AliasObservation).where(AliasObservation.alias == ALIAS))
        conn.execute(insert(AliasObservation).values(alias=ALIAS, **values))


def _send(eng: Engine, at: datetime, n: int) -> None:
    """``n`` calls of 50k input tokens, 45k of them cache reads."""
    with eng.begin() as conn:
        conn.execute(
            insert(LlmCall),
            [
                {
                    "alias": ALIAS,
                    "requested_at": at,
                    "input_tokens": 50_000,
                    "cached_input_tokens": 45_000,
                    "output_tokens": 100,
                    "status": 200,
                    "latency_s": 1.0,
                }
                for _ in range(n)
            ],
        )


@pytest.mark.parametrize("provider_counts", [False, True])
def test_the_stated_bucket_corrects_a_wrong_cache_counting_belief(
    plan_ledger: Engine, provider_counts: bool
) -> None:
    """The alias config says cache reads count (sim-openai); the limit is 27k tokens/s (405k
    per 15 s, a 1.62M bucket). A provider that ignores cache reads accepts 20 calls per 15 s
    (1M tokens, 0.9M of them cache reads) and its bucket stays full: the planner stops
    charging them. One that counts them is drained by a first burst and then accepts what
    refills it: the belief stands."""
    add_run(plan_ledger, running=5, queued=30)
    remaining = 1_620_000.0
    for k in range(10):
        at = T0 + timedelta(seconds=15 * k)
        n = 20 if not provider_counts else (30 if k == 0 else 8)
        _send(plan_ledger, at - timedelta(seconds=10), n)
        if provider_counts:
            remaining = min(1_620_000.0, remaining + 405_000.0) - n * 50_100
        _observe_bucket(plan_ledger, at - timedelta(seconds=1), remaining)
        plan.plan_tick(at, False)
    row = stored(plan_ledger)
    assert row.state.cached_input_counts is provider_counts
    assert row.counting is not None and row.counting["anchors"]
    if not provider_counts:
        assert row.state.budgets.tokens_per_s == pytest.approx(27_000.0)  # the stated limit
