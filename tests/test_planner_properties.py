"""Properties of the planner's two decision functions over inputs no example test chose.

The example tests (``test_sizing``, ``test_budgets`` and the rest) pin each rule on a
hand-built case. These draw fleets, budgets, caps and flags (``planner.sizing.decide``) and
whole sequences of planner windows, with any mix of 429s, headers and measured rates
(``planner.budgets.step``), and check what must hold whatever the rules decide:

- a decision never launches more than is queued, nor past its ceiling; every cap present
  bounds the ceiling; paused, cooldown and an empty queue launch nothing; work queued is never
  left behind a silent zero ceiling (only a named cap, a pause or a cooldown may say 0);
- the controller never raises on what a gateway may report, keeps every budget positive and
  finite and under every limit a header states, cuts only the class a 429 names (a request
  429 leaves the token budgets alone and a token 429 the request budget), cuts nothing for
  spend or overload, pauses the run on a spend error, freezes launches for at least the
  cooldown after a rate-limit 429, and (where no header moves it) lowers a budget only by a
  cut or a re-base.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from planner.blame import NOT_RATE_LIMITS
from planner.budgets import (
    BudgetClass,
    Budgets,
    BudgetState,
    ControllerConfig,
    WindowObservation,
    initial_state,
    step,
)
from planner.classify import LimitType
from planner.curves import HarnessCurve, default_curve
from planner.decision import Binding
from planner.sizing import Caps, Counting, FleetState, SizingConfig, decide, steady_state
from tests.property_support import PROPERTIES, log_uniform

CFG = ControllerConfig()
REQ, TOK, OUT, INFL = (
    BudgetClass.REQUESTS,
    BudgetClass.TOKENS,
    BudgetClass.OUTPUT_TOKENS,
    BudgetClass.INFLIGHT,
)
RATE_CLASSES = (REQ, TOK, OUT)


# --- sizing -------------------------------------------------------------------------------

_CURVE: HarnessCurve = default_curve()
_STEADY = {
    (cached, combined): steady_state(
        _CURVE, Counting(cached_input_counts=cached, combined=combined), 60.0, 7200.0
    )
    for cached in (False, True)
    for combined in (False, True)
}


@dataclass(frozen=True)
class _SizingBudgets:
    calls_per_s: float
    tokens_per_s: float
    output_tokens_per_s: float | None
    inflight_tokens: float


#: a flag set one time in four, so most drawn fleets are free to launch
_rarely = st.sampled_from((False, False, False, True))
#: a cap is absent three times in four, so most drawn fleets are sized by their budgets
_caps = st.one_of(st.none(), st.none(), st.none(), st.integers(0, 2_000))


@st.composite
def _sizing_case(draw: st.DrawFn) -> tuple[FleetState, _SizingBudgets, Counting, Caps]:
    running = draw(st.integers(0, 40) | st.integers(0, 3_000))
    ages = draw(
        st.lists(st.floats(0.0, 20_000.0), min_size=running, max_size=running)
        if running <= 50
        else st.just(list(np.random.default_rng(running).uniform(0.0, 5_000.0, running)))
    )
    fleet = FleetState(
        now=draw(st.floats(0.0, 1e6)),
        ages=np.asarray(ages, dtype=float),
        booting=draw(st.integers(0, 10) | st.integers(0, 500)),
        queued=draw(st.integers(0, 100) | st.integers(0, 100_000)),
        paused=draw(_rarely),
        in_cooldown=draw(_rarely),
        stale=draw(_rarely),
        progress=draw(st.floats(0.01, 1.0)),
        ramping=draw(_rarely),
        instance_timeout_s=draw(st.none() | st.floats(60.0, 86_400.0)),
    )
    counting = Counting(cached_input_counts=draw(st.booleans()), combined=draw(st.booleans()))
    # each budget has room for about ``slots`` steady tasks (each its own 10x either way), a
    # few times more or fewer than are live, so most drawn fleets sit near their budgets: some
    # over them, some launching, each budget binding in turn
    live = fleet.ages.size + fleet.booting
    slots = max(live, 1) * draw(log_uniform(0.2, 20.0))
    rates = _STEADY[(counting.cached_input_counts, counting.combined)].slot_rates

    def room(quantity: str) -> float:
        return rates[quantity] * slots * draw(log_uniform(0.2, 5.0))

    budgets = _SizingBudgets(
        calls_per_s=room("calls_per_s"),
        tokens_per_s=room("tokens_per_s"),
        output_tokens_per_s=draw(st.none() | st.just(room("output_tokens_per_s"))),
        inflight_tokens=room("inflight_tokens"),
    )
    caps = Caps(static=draw(_caps), run=draw(_caps), override=draw(_caps))
    return fleet, budgets, counting, caps


@PROPERTIES
@given(_sizing_case())
def test_a_decision_keeps_to_its_queue_its_ceiling_its_caps_and_its_flags(
    case: tuple[FleetState, _SizingBudgets, Counting, Caps],
) -> None:
    fleet, budgets, counting, caps = case
    steady = _STEADY[(counting.cached_input_counts, counting.combined)]
    d = decide(fleet, _CURVE, budgets, counting, caps, SizingConfig(), steady=steady)
    live = int(fleet.ages.size) + fleet.booting

    assert d.live == live and d.queued == fleet.queued
    assert 0 <= d.launches_allowed <= fleet.queued
    assert d.launches_allowed <= max(d.ceiling - live, 0)
    for cap in (caps.static, caps.run, caps.override):
        if cap is not None:
            assert d.ceiling <= cap
    assert all(math.isfinite(v) for v in d.projections.values())
    if fleet.paused:
        assert d.binding is Binding.PAUSED and d.launches_allowed == 0
        assert d.ceiling <= live
    elif fleet.queued == 0:
        assert d.binding is Binding.NO_WORK and d.launches_allowed == 0
    elif fleet.in_cooldown:
        assert d.binding is Binding.COOLDOWN and d.launches_allowed == 0
        assert d.ceiling <= live
    else:
        # work is queued and nothing holds launches: a zero ceiling is a cap that says so
        named_zero = any(c == 0 for c in (caps.static, caps.run, caps.override))
        if not named_zero:
            assert d.ceiling >= 1
            if d.ceiling > live:
                assert d.launches_allowed == min(d.ceiling - live, fleet.queued)
        if fleet.stale and d.binding not in (Binding.RUN_CAP, Binding.CEILING_OVERRIDE):
            assert d.binding is Binding.STALE_CONFIG


# --- the budget controller ----------------------------------------------------------------

_LIMIT_TYPES = (
    LimitType.REQUESTS,
    LimitType.TOKENS,
    LimitType.INPUT_TOKENS,
    LimitType.OUTPUT_TOKENS,
    LimitType.UNKNOWN,
    LimitType.SPEND,
    LimitType.OVERLOAD,
    LimitType.DAILY,
)
_rates_by_class = st.none() | st.dictionaries(
    st.sampled_from(RATE_CLASSES), st.floats(0.0, 1e7), max_size=3
)


@st.composite
def _window(draw: st.DrawFn, now: float, combined: bool) -> WindowObservation:
    token_limit = LimitType.TOKENS if combined else LimitType.INPUT_TOKENS
    throttles = draw(
        st.lists(
            st.tuples(st.sampled_from(_LIMIT_TYPES), st.none() | st.floats(0.0, 600.0)),
            max_size=4,
        )
    )
    headers = draw(
        st.none()
        | st.dictionaries(
            st.sampled_from((LimitType.REQUESTS, token_limit, LimitType.OUTPUT_TOKENS)),
            log_uniform(10.0, 1e9),
            min_size=1,
            max_size=3,
        )
    )
    return WindowObservation(
        now=now,
        throttles=tuple(throttles),
        overloads=draw(st.integers(0, 3)),
        spend_errors=draw(st.sampled_from((0, 0, 0, 1))),
        observed_limits=headers,
        utilisation=draw(
            st.none() | st.dictionaries(st.sampled_from(RATE_CLASSES), st.floats(0.0, 2.0))
        ),
        delivered=draw(_rates_by_class),
        drained=draw(_rates_by_class),
        answered=draw(st.integers(0, 500)),
        largest_accepted=draw(
            st.none() | st.dictionaries(st.sampled_from((TOK, OUT)), st.floats(0.0, 1e6))
        ),
        sized_by_inflight=draw(st.booleans()),
        settled_drained=draw(_rates_by_class),
    )


@st.composite
def _run(draw: st.DrawFn) -> tuple[BudgetState, list[WindowObservation]]:
    combined = draw(st.booleans())
    seed = Budgets(
        calls_per_s=draw(log_uniform(0.01, 1e4)),
        tokens_per_s=draw(log_uniform(1.0, 1e7)),
        output_tokens_per_s=draw(st.none() | log_uniform(0.1, 1e6)),
        inflight_tokens=draw(log_uniform(1e3, 1e10)),
    )
    state = initial_state(
        seed,
        0.0,
        seeded_at=-draw(st.floats(0.0, 48.0)) * 3600.0,
        cached_input_counts=draw(st.booleans()),
        token_class="combined" if combined else "input",
    )
    windows, now = [], 0.0
    for _ in range(draw(st.integers(1, 40))):
        now += draw(st.sampled_from((15.0, 15.0, 15.0, 1.0, 60.0, 900.0)))
        windows.append(draw(_window(now, combined)))
    return state, windows


def _budget_values(state: BudgetState) -> dict[BudgetClass, float]:
    return {c: v for c in BudgetClass if (v := state.budgets.get(c)) is not None}


@PROPERTIES
@given(_run())
def test_the_controller_keeps_its_budgets_sound_through_any_run_of_windows(
    run: tuple[BudgetState, list[WindowObservation]],
) -> None:
    state, windows = run
    for obs in windows:
        before = _budget_values(state)
        state, actions = step(state, obs, CFG)
        after = _budget_values(state)
        where = f"at {obs.now:.0f} s after {obs.throttles} with headers {obs.observed_limits}"

        assert after.keys() >= before.keys(), where  # a budgeted class is never dropped
        for cls, value in after.items():
            assert math.isfinite(value) and value > 0, (cls, value, where)
            cap = state.hard_caps.get(cls)
            if cap is not None:
                assert value <= cap * (1 + 1e-9), (cls, value, cap, where)

        kinds = {lt for lt, _ in obs.throttles}
        rate_limited = kinds - NOT_RATE_LIMITS
        if obs.spend_errors or LimitType.SPEND in kinds:
            assert actions.pause_run, where
        if rate_limited:
            assert actions.cooldown_until is not None, where
            assert actions.cooldown_until >= obs.now + CFG.cooldown_s - 1e-9, where
        if obs.observed_limits is None and not rate_limited:
            assert actions.cut == (), where  # spend, overload and a day's limit cut nothing
        if obs.observed_limits is None and kinds and kinds <= {LimitType.REQUESTS}:
            assert set(actions.cut) <= {REQ}, where
        if (
            obs.observed_limits is None
            and kinds
            and kinds <= {LimitType.TOKENS, LimitType.INPUT_TOKENS}
        ):
            assert REQ not in actions.cut, where
            assert after[REQ] >= before[REQ] * (1 - 1e-9), where
        for cls in set(before) - set(actions.cut) - set(actions.rebased):
            if obs.observed_limits is None and cls is not INFL and not actions.reseeded:
                assert after[cls] >= before[cls] * (1 - 1e-9) or cls in state.hard_caps, (
                    f"{cls} fell from {before[cls]} to {after[cls]} without a cut or a re-base {where}"
                )
