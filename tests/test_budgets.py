"""The budget controller: one test per rule of issue 3 item 3."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from evalfleet.errors import ConfigError
from planner.budgets import (
    BudgetClass,
    Budgets,
    BudgetState,
    ControllerConfig,
    WindowObservation,
    initial_state,
    rebase,
    step,
)
from planner.classify import LimitType
from tests.budget_support import CFG, SEED, TOK, clean_until, fresh, window


def test_initial_state_from_config() -> None:
    s = fresh(100.0)
    assert s.budgets == SEED and s.seed == SEED
    assert s.seed_source == "config" and s.seeded_at == 100.0
    assert not s.in_cooldown(100.0) and not s.is_stale(100.0)


def test_headers_win_over_config_and_are_hard_caps() -> None:
    observed = {
        LimitType.REQUESTS: 1200.0,  # 20/s, below the configured 50/s
        LimitType.INPUT_TOKENS: 2_400_000.0,  # 40,000/s, above the configured 25,000/s
        LimitType.TOKENS: 9_999_999.0,  # combined: not this alias's token class
    }
    s = fresh(0.0, observed_limits=observed)
    assert s.seed_source == "headers"
    assert s.budgets.calls_per_s == pytest.approx(20.0)
    assert s.budgets.tokens_per_s == pytest.approx(40_000.0)
    assert s.budgets.output_tokens_per_s == 5_000.0  # no header: config
    assert s.hard_caps == {BudgetClass.REQUESTS: 20.0, BudgetClass.TOKENS: 40_000.0}
    for i in range(1, 40):  # clean windows, each restating the limits, never grow past them
        s, _ = window(s, 15.0 * i, observed_limits=observed)
    assert s.budgets.calls_per_s == pytest.approx(20.0)
    assert s.budgets.tokens_per_s == pytest.approx(40_000.0)
    assert s.budgets.output_tokens_per_s == pytest.approx(7_500.0)  # 1.5x its seed


def test_combined_alias_reads_the_combined_token_header() -> None:
    s = initial_state(
        SEED,
        0.0,
        observed_limits={LimitType.TOKENS: 600_000.0, LimitType.INPUT_TOKENS: 1.0},
        cached_input_counts=True,
        token_class="combined",
    )
    assert s.budgets.tokens_per_s == pytest.approx(10_000.0)


def test_input_alias_falls_back_to_the_single_token_header() -> None:
    s = fresh(0.0, observed_limits={LimitType.TOKENS: 600_000.0})  # OpenAI-style headers
    assert s.budgets.tokens_per_s == pytest.approx(10_000.0)
    assert s.hard_caps[BudgetClass.TOKENS] == pytest.approx(10_000.0)


def test_clean_windows_grow_5_percent_up_to_1_5x_seed() -> None:
    s = fresh()
    s, a = window(s, 15.0)
    assert s.budgets.calls_per_s == pytest.approx(50.0 * 1.05)
    assert set(a.grown) == set(BudgetClass)
    for i in range(2, 60):
        s, _ = window(s, 15.0 * i)
    assert s.budgets.calls_per_s == pytest.approx(75.0)
    assert s.budgets.tokens_per_s == pytest.approx(37_500.0)
    assert s.budgets.inflight_tokens == pytest.approx(3_000_000.0)


def test_request_429_leaves_the_token_budgets_alone() -> None:
    s = fresh()
    s, a = window(s, 15.0, LimitType.REQUESTS, LimitType.REQUESTS)
    assert a.cut == (BudgetClass.REQUESTS,)
    assert s.budgets.calls_per_s == pytest.approx(50.0 * CFG.cut)
    assert s.budgets.tokens_per_s == SEED.tokens_per_s
    assert s.budgets.output_tokens_per_s == SEED.output_tokens_per_s
    assert s.budgets.inflight_tokens == SEED.inflight_tokens
    assert s.in_cooldown(15.0 + CFG.cooldown_s - 1) and not s.in_cooldown(15.0 + CFG.cooldown_s)


@pytest.mark.parametrize("limit", [LimitType.TOKENS, LimitType.INPUT_TOKENS])
def test_token_429_leaves_the_request_budget_alone(limit: LimitType) -> None:
    s, a = window(fresh(), 15.0, limit)
    assert a.cut == (BudgetClass.TOKENS,)
    assert s.budgets.tokens_per_s == pytest.approx(25_000.0 * CFG.cut)
    assert s.budgets.calls_per_s == SEED.calls_per_s
    assert s.budgets.output_tokens_per_s == SEED.output_tokens_per_s


def test_output_429_cuts_the_output_budget_only() -> None:
    s, a = window(fresh(), 15.0, LimitType.OUTPUT_TOKENS)
    assert a.cut == (BudgetClass.OUTPUT_TOKENS,)
    assert s.budgets.tokens_per_s == SEED.tokens_per_s


def test_output_429_without_output_budget_on_a_combined_alias_cuts_tokens() -> None:
    seed = Budgets(calls_per_s=5, tokens_per_s=1000, output_tokens_per_s=None, inflight_tokens=1e5)
    s = initial_state(seed, 0.0, cached_input_counts=False, token_class="combined")
    s, a = window(s, 15.0, LimitType.OUTPUT_TOKENS)
    assert a.cut == (BudgetClass.TOKENS,)


def test_unknown_429_cuts_every_budget() -> None:
    s, a = window(fresh(), 15.0, LimitType.UNKNOWN)
    assert set(a.cut) == set(BudgetClass)
    for cls in BudgetClass:
        assert s.budgets.get(cls) == pytest.approx(SEED.get(cls) * CFG.cut)  # type: ignore[operator]


def test_a_freeze_blocks_growth_and_one_cut_per_cooldown() -> None:
    s, _ = window(fresh(), 15.0, LimitType.REQUESTS)
    cut_level = s.budgets.calls_per_s
    s, a = window(s, 30.0, LimitType.REQUESTS)  # stragglers sent before the cut
    assert a.cut == () and s.budgets.calls_per_s == cut_level
    assert a.grown == ()  # frozen: nothing grows, not even the token budgets
    s, a = window(s, 45.0)  # freeze (until 60) overlaps this window
    assert a.grown == ()
    s, a = window(s, 90.0)
    assert BudgetClass.TOKENS in a.grown


def test_retry_after_stretches_the_freeze_within_bounds() -> None:
    obs = WindowObservation(now=15.0, throttles=((LimitType.TOKENS, 120.0),))
    s, a = step(fresh(), obs, CFG)
    assert a.cooldown_until == 135.0 and s.in_cooldown(134.0)
    obs = WindowObservation(now=15.0, throttles=((LimitType.TOKENS, 1e6),))
    s, _ = step(fresh(), obs, CFG)
    assert s.cooldown_until == 15.0 + CFG.max_freeze_s


def test_growth_does_not_return_above_a_level_that_drew_a_429_recently() -> None:
    s = fresh()
    for i in range(1, 6):
        s, _ = window(s, 15.0 * i)
    level = s.budgets.tokens_per_s
    s, _ = window(s, 90.0, LimitType.TOKENS)
    t = 90.0
    for _ in range(int((CFG.memory_s - 30.0) // 15.0)):  # clean windows within the memory
        t += 15.0
        s, _ = window(s, t)
        assert s.budgets.tokens_per_s <= level * (1 - CFG.probe_margin) + 1e-9
    assert s.budgets.tokens_per_s == pytest.approx(level * (1 - CFG.probe_margin))
    while t < 90.0 + CFG.memory_s + 60:  # memory expired: growth may probe again
        t += 15.0
        s, _ = window(s, t)
    assert s.budgets.tokens_per_s > level


def test_a_reprobe_that_finds_the_same_limit_keeps_its_level_and_doubles_the_memory() -> None:
    """A steady limit is re-probed ever more rarely: after the memory lapses growth probes
    past the old level; a 429 there, at about the same level, confirms it. The budget goes
    back under the old level (what held for the whole memory), not under the higher level
    the re-probe reached (a staircase of 429s down from it), and that level is remembered
    twice as long. The cut starts from the old level too: the per-minute bucket let the
    re-probe climb past the limit before it emptied, and a cut from there lands above the
    limit and draws the next 429 (random-401: four more)."""
    s = replace(fresh(), budgets=replace(SEED, tokens_per_s=30_000.0))
    s, _ = window(s, 15.0, LimitType.TOKENS)
    assert s.last_429_level[TOK] == 30_000.0
    s, t = clean_until(s, 15.0, 15.0 + CFG.memory_s + 45.0)
    reached = s.budgets.tokens_per_s
    assert 30_000.0 < reached <= 30_000.0 * CFG.reprobe_same  # re-probing past the old level
    t += 15.0
    s, _ = window(s, t, LimitType.TOKENS)
    assert s.last_429_level[TOK] == 30_000.0
    assert s.level_memory_s[TOK] == 2 * CFG.memory_s
    assert s.budgets.tokens_per_s == pytest.approx(30_000.0 * CFG.cut)
    s, t = clean_until(s, t, t + 1.5 * CFG.memory_s)  # past memory_s, within twice it
    assert s.budgets.tokens_per_s == pytest.approx(30_000.0 * (1 - CFG.probe_margin))
    s, t = clean_until(s, t, t + CFG.memory_s)  # twice memory_s lapsed: probes again
    assert s.budgets.tokens_per_s > 30_000.0


def test_a_reprobe_that_the_per_minute_bucket_let_climb_40_percent_still_confirms() -> None:
    """Growing 5% per window, a re-probe of an unchanged limit climbs on while the provider's
    full per-minute bucket drains: unchanged limits drew their re-probe 429s 27-75% above the
    old level (random-401, random-413, random-515). Such a 429 confirms the old level; taken
    for a raised limit, it started a staircase of 429s down from the overshoot."""
    s = replace(fresh(), budgets=replace(SEED, tokens_per_s=20_000.0))
    s, _ = window(s, 15.0, LimitType.TOKENS)
    s, t = clean_until(s, 15.0, 15.0 + CFG.memory_s + 45.0)
    s = replace(s, budgets=replace(s.budgets, tokens_per_s=1.4 * 20_000.0))
    t += 15.0
    s, _ = window(s, t, LimitType.TOKENS)
    assert s.last_429_level[TOK] == 20_000.0
    assert s.level_memory_s[TOK] == 2 * CFG.memory_s
    assert s.budgets.tokens_per_s == pytest.approx(20_000.0 * CFG.cut)


def test_a_reprobe_past_the_old_level_remembers_the_new_limit_for_the_first_memory() -> None:
    """A limit raised mid-run, no header to say so: the re-probe after the memory lapses
    grows well past the old level before its 429; that level (the new limit) is remembered,
    for ``memory_s`` again."""
    s = replace(fresh(), budgets=replace(SEED, tokens_per_s=20_000.0))
    s, _ = window(s, 15.0, LimitType.TOKENS)
    s, t = clean_until(s, 15.0, 15.0 + CFG.memory_s + 600.0)
    reached = s.budgets.tokens_per_s
    assert reached > 20_000.0 * CFG.reprobe_same
    t += 15.0
    s, _ = window(s, t, LimitType.TOKENS)
    assert s.last_429_level[TOK] == reached
    assert s.level_memory_s[TOK] == CFG.memory_s


def _run_dropping_limit(
    cfg: ControllerConfig, hours: float = 2.5
) -> tuple[BudgetState, list[float], list[float], float]:
    """A provider whose token limit drops to 40% of the seed at t=600: each window with a
    budget above the true limit draws a token 429."""
    s = fresh()
    true_before, true_after, drop_at = 30_000.0, 10_000.0, 600.0
    t = 0.0
    throttled_at: list[float] = []
    budgets_after: list[float] = []
    while t < hours * 3600:
        t += 15.0
        true = true_before if t < drop_at else true_after
        over = s.budgets.tokens_per_s > true
        obs = WindowObservation(now=t, throttles=((LimitType.TOKENS, None),) if over else ())
        s, _ = step(s, obs, cfg)
        if over:
            throttled_at.append(t)
        if t > drop_at + 1800:
            budgets_after.append(s.budgets.tokens_per_s)
        assert s.budgets.calls_per_s >= SEED.calls_per_s  # never touched by token 429s
    return s, throttled_at, budgets_after, true_after


def test_a_limit_that_drops_below_the_seed_is_followed_down_not_reprobed() -> None:
    s, throttled, after, true = _run_dropping_limit(CFG)
    assert s.seed.tokens_per_s < SEED.tokens_per_s  # re-based
    late = [t for t in throttled if t > 600.0 + 600]
    # settled after 10 minutes; then at most one probe per memory period (2 h 20 min: <= 7)
    probes = math.ceil((2.5 * 3600 - 1200.0) / CFG.memory_s)
    assert len(late) <= probes, late
    assert sum(b > true for b in after) <= probes  # above the true limit only when probing
    assert sum(after) / len(after) >= 0.8 * true  # follows it closely, not far below

    # the naive controller (no re-base, no memory of the 429 level) re-probes every few windows
    naive = ControllerConfig(memory_s=0.0, rebase_cuts=20)
    _, naive_throttled, _, _ = _run_dropping_limit(naive)
    naive_late = [t for t in naive_throttled if t > 600.0 + 600]
    assert len(naive_late) >= 5 * max(1, len(late))


def test_spend_pauses_the_run_and_cuts_nothing() -> None:
    s, a = window(fresh(), 15.0, spend_errors=1)
    assert a.pause_run and a.cut == ()
    assert s.budgets.calls_per_s > 0
    s2, a2 = window(fresh(), 15.0, LimitType.SPEND)
    assert a2.pause_run and a2.cut == () and s2.budgets.tokens_per_s >= SEED.tokens_per_s


def test_overload_backs_off_without_a_cut() -> None:
    s, a = window(fresh(), 15.0, overloads=3)
    assert a.cut == () and a.grown == ()
    assert a.backoff_until == 15.0 + CFG.overload_backoff_s
    assert s.in_cooldown(20.0)
    assert s.budgets == SEED
    s, a = window(fresh(), 15.0, LimitType.OVERLOAD)
    assert a.backoff_until is not None and a.cut == ()


def test_stale_config_without_headers_keeps_its_values_and_reports_stale() -> None:
    s = fresh(now=7 * 3600.0, seeded_at=0.0)
    assert s.is_stale(7 * 3600.0)
    s, a = window(s, 7 * 3600.0 + 15)
    assert a.stale and not a.reseeded
    assert s.budgets.calls_per_s > 0 and s.budgets.tokens_per_s > 0


def test_stale_never_yields_zero_even_under_repeated_unknown_429s() -> None:
    s = fresh(now=7 * 3600.0, seeded_at=0.0)
    t = 7 * 3600.0
    for _ in range(500):
        t += 45.0
        s, a = window(s, t, LimitType.UNKNOWN)
        assert a.stale or s.seed_source == "controller"
        for cls in BudgetClass:
            value = s.budgets.get(cls)
            assert value is not None and value > 0


def test_a_stale_seed_without_headers_is_a_guess_either_way() -> None:
    """A ten-hour-old seed nothing has confirmed may be far below the provider's limits
    (``tr-stale-low-none``: 0.35x): growth may take it to ``stale_max_over_seed`` x, not only
    1.5x, and a 429 up there cuts by ``cut`` from the level reached, not back down to the
    stale seed (which threw the fleet back to a third of the limit)."""
    hours7 = 7 * 3600.0
    stale, t = clean_until(fresh(now=hours7, seeded_at=0.0), hours7, hours7 + 600.0)
    current, _ = clean_until(fresh(now=hours7, seeded_at=hours7), hours7, hours7 + 600.0)
    assert current.budgets.tokens_per_s == pytest.approx(CFG.max_over_seed * SEED.tokens_per_s)
    assert stale.budgets.tokens_per_s == pytest.approx(CFG.stale_max_over_seed * SEED.tokens_per_s)
    level = stale.budgets.tokens_per_s
    stale, _ = window(stale, t + CFG.window_s, LimitType.INPUT_TOKENS)
    assert stale.budgets.tokens_per_s == pytest.approx(level * CFG.cut)
    current, _ = window(current, t + CFG.window_s, LimitType.INPUT_TOKENS)
    assert current.budgets.tokens_per_s == pytest.approx(SEED.tokens_per_s)  # to the seed


def test_stale_config_reseeds_from_the_latest_headers() -> None:
    s = fresh(now=0.0, seeded_at=-5 * 3600.0)  # config written 5 h before start
    s, _ = window(s, 3600.0)  # no headers yet
    # headers seen once: they win at once (re-seed, fresh seeded_at)
    s, _ = window(s, 3615.0, observed_limits={LimitType.REQUESTS: 600.0})
    assert s.seed_source == "headers" and s.seeded_at == 3615.0
    assert s.budgets.calls_per_s == pytest.approx(10.0)
    # more than 6 h later with no new headers: the latest headers are as old as the seed, so
    # there is nothing fresh to re-seed from; it keeps its values and reports stale
    s, a = window(s, 3615.0 + 6 * 3600 + 15)
    assert a.stale and s.budgets.calls_per_s > 0


def test_stale_reseed_uses_recent_headers() -> None:
    s = fresh(now=0.0)
    s, _ = window(s, 15.0, observed_limits={LimitType.INPUT_TOKENS: 1_200_000.0})
    assert s.budgets.tokens_per_s == pytest.approx(20_000.0)
    # operator re-base later makes the seed fresh, then it ages past 6 h while headers stay
    s = rebase(s, SEED, 100.0)
    s, _ = window(s, 3600.0, observed_limits={LimitType.INPUT_TOKENS: 1_500_000.0})
    s = rebase(s, SEED, 100.0)  # seeded at 100, latest headers at 3600
    s, a = window(s, 100.0 + 6 * 3600 + 15)
    assert a.reseeded and not a.stale
    assert s.seed.tokens_per_s == pytest.approx(25_000.0)  # 1.5M/min
    assert s.seed_source == "headers"


def test_operator_rebase() -> None:
    s, _ = window(fresh(), 15.0, LimitType.TOKENS)
    new_seed = Budgets(calls_per_s=10, tokens_per_s=5000, output_tokens_per_s=None,
                       inflight_tokens=1e6)  # fmt: skip
    s = rebase(s, new_seed, 30.0)
    assert s.seed == new_seed and s.budgets == new_seed
    assert s.seed_source == "operator" and s.seeded_at == 30.0
    assert s.last_429_level == {}
    assert s.last_429_at == {} and s.level_memory_s == {} and s.cuts_below_seed == {}
    capped = fresh(observed_limits={LimitType.REQUESTS: 60.0})  # 1/s hard cap
    capped = rebase(capped, SEED, 10.0)
    assert capped.budgets.calls_per_s == pytest.approx(1.0)


def test_bad_values_are_clear_errors() -> None:
    with pytest.raises(ConfigError, match="growth"):
        ControllerConfig(growth=2.0)
    with pytest.raises(ConfigError, match="stale_max_over_seed"):
        ControllerConfig(stale_max_over_seed=1.2)  # below max_over_seed
    with pytest.raises(ConfigError, match="unchecked_memory_s"):
        ControllerConfig(unchecked_memory_s=-1.0)
    with pytest.raises(ConfigError, match="provider_burst_s"):
        ControllerConfig(provider_burst_s=-5.0)
    with pytest.raises(ConfigError, match="calls_per_s"):
        Budgets(calls_per_s=0, tokens_per_s=1, output_tokens_per_s=None, inflight_tokens=1)
    with pytest.raises(ConfigError, match="tokens_per_s"):
        Budgets(calls_per_s=1, tokens_per_s=float("nan"), output_tokens_per_s=None,
                inflight_tokens=1)  # fmt: skip


def test_with_a_utilisation_gate_only_budgets_that_were_used_grow() -> None:
    util = {BudgetClass.REQUESTS: 0.95, BudgetClass.TOKENS: 0.3, BudgetClass.INFLIGHT: 0.1}
    gated = replace(CFG, grow_min_utilisation=0.8)
    s, a = step(fresh(), WindowObservation(now=15.0, utilisation=util), gated)
    assert a.grown == (BudgetClass.REQUESTS,)
    assert s.budgets.tokens_per_s == SEED.tokens_per_s  # not pressed against: proves nothing


def test_a_429_above_the_seed_cuts_back_to_the_seed() -> None:
    s = fresh()
    for i in range(1, 10):
        s, _ = window(s, 15.0 * i)
    assert s.budgets.tokens_per_s > SEED.tokens_per_s / CFG.cut  # well above the seed
    s, _ = window(s, 150.0, LimitType.TOKENS)
    assert s.budgets.tokens_per_s == SEED.tokens_per_s
    plain = ControllerConfig(cut_to_seed=False)
    s2 = fresh()
    for i in range(1, 10):
        s2, _ = step(s2, WindowObservation(now=15.0 * i), plain)
    s2, _ = step(s2, WindowObservation(now=150.0, throttles=((LimitType.TOKENS, None),)), plain)
    assert s2.budgets.tokens_per_s > SEED.tokens_per_s


def test_a_repeated_cut_goes_down_to_what_the_provider_accepted() -> None:
    # The limit halved (no headers): the first cut (x0.75) is not enough, the provider keeps
    # rejecting through the cooldown, and what it accepted meanwhile is its limit.
    first, _ = window(fresh(), 15.0, LimitType.TOKENS, delivered={BudgetClass.TOKENS: 24_000.0})
    assert first.budgets.tokens_per_s == pytest.approx(25_000.0 * CFG.cut)  # first: by `cut`
    accepted = {BudgetClass.TOKENS: 12_500.0, BudgetClass.REQUESTS: 3.0}
    second, a = window(first, 15.0 + CFG.cooldown_s, LimitType.TOKENS, delivered=accepted)
    assert BudgetClass.TOKENS in a.cut
    assert second.budgets.tokens_per_s == pytest.approx(12_500.0 * (1 - CFG.probe_margin))
    # the request budget was not hit: its (demand-limited) acceptance is not a limit
    assert second.budgets.calls_per_s == first.budgets.calls_per_s


def test_a_cut_long_after_the_last_uses_the_cut_factor_only() -> None:
    first, _ = window(fresh(), 15.0, LimitType.TOKENS)
    later = 15.0 + 3 * CFG.cooldown_s
    s, _ = window(first, later, LimitType.TOKENS, delivered={BudgetClass.TOKENS: 1_000.0})
    assert s.budgets.tokens_per_s == pytest.approx(first.budgets.tokens_per_s * CFG.cut)


def test_a_429_residue_after_a_cut_eases_the_budget_without_capping_it() -> None:
    # an overshoot drew a cut; a cooldown later one more 429 arrives although the provider
    # accepted all the cut level let through: its per-minute bucket was still in debt
    first, _ = window(fresh(), 15.0, LimitType.TOKENS)
    level = first.budgets.tokens_per_s
    accepted = {BudgetClass.TOKENS: level * 1.02}
    s, _ = window(first, 15.0 + CFG.cooldown_s, LimitType.TOKENS, delivered=accepted)
    assert s.budgets.tokens_per_s == pytest.approx(level * (1 - CFG.probe_margin))
    assert s.last_429_level[BudgetClass.TOKENS] == first.last_429_level[BudgetClass.TOKENS]
    assert s.seed == first.seed  # not counted towards a re-base
    # growth may come back to just below the level that did draw a 429, not only to this one
    for i in range(2, 40):
        s, _ = window(s, 15.0 * i + CFG.cooldown_s)
    ceiling = first.last_429_level[BudgetClass.TOKENS] * (1 - CFG.probe_margin)
    assert s.budgets.tokens_per_s == pytest.approx(ceiling)
    assert s.budgets.tokens_per_s > level


def test_a_measured_cut_goes_no_lower_than_two_blind_cuts() -> None:
    # rejected requests count against an OpenAI request limit: retries of rejected calls can
    # keep the bucket so empty that almost nothing is accepted in the window
    first, _ = window(fresh(), 15.0, LimitType.REQUESTS)
    level = first.budgets.calls_per_s
    starved = {BudgetClass.REQUESTS: 0.1}
    s, _ = window(first, 15.0 + CFG.cooldown_s, LimitType.REQUESTS, delivered=starved)
    assert s.budgets.calls_per_s == pytest.approx(level * CFG.cut * CFG.cut)


def test_a_per_day_limit_backs_off_for_its_retry_after_and_cuts_nothing() -> None:
    start = fresh()
    obs = WindowObservation(now=15.0, throttles=((LimitType.DAILY, 120.0),))
    s, a = step(start, obs, CFG)
    assert a.cut == () and s.budgets == SEED and s.last_429_level == {}
    assert s.backoff_until == pytest.approx(135.0) and s.in_cooldown(134.0)
    long = WindowObservation(now=15.0, throttles=((LimitType.DAILY, 36_000.0),))
    s, _ = step(start, long, CFG)
    assert s.backoff_until == pytest.approx(15.0 + CFG.max_freeze_s)  # bounded, re-read later
