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
from tests.budget_support import CFG, OUT, REQ, SEED, TOK, clean_until, fresh, window


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
    for i in range(1, 40):  # clean windows never grow past a header limit
        s, _ = window(s, 15.0 * i)
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


def test_a_stated_output_limit_gets_a_budget_the_config_did_not_have() -> None:
    """Anthropic states an output-token limit; an alias configured without an output budget
    adopts it, so the output limit's 429s cut that budget, not every other one."""
    seed = Budgets(calls_per_s=50, tokens_per_s=25_000, output_tokens_per_s=None,
                   inflight_tokens=2e6)  # fmt: skip
    s = initial_state(seed, 0.0, cached_input_counts=False, token_class="input")
    s, a = window(s, 15.0, observed_limits={LimitType.OUTPUT_TOKENS: 150_000.0})
    assert s.budgets.output_tokens_per_s == pytest.approx(2_500.0)
    assert s.seed.output_tokens_per_s == pytest.approx(2_500.0)
    assert s.hard_caps[BudgetClass.OUTPUT_TOKENS] == pytest.approx(2_500.0)
    assert any("did not budget" in note for note in a.notes)
    s, a = window(s, 30.0, LimitType.OUTPUT_TOKENS)
    assert a.cut == (BudgetClass.OUTPUT_TOKENS,)
    assert s.budgets.tokens_per_s == pytest.approx(25_000.0 * 1.05)  # grown, not cut
    assert s.budgets.calls_per_s == pytest.approx(50.0 * 1.05)


def test_a_limit_only_a_429_stated_lapses_and_a_raise_is_found() -> None:
    """OpenAI names an output-token limit in a 429's message, never in its success headers.
    Stated once, it caps the output budget; not stated again for ``stated_cap_memory_s`` it no
    longer does, so growth probes above it and finds a limit the provider raised since (a cap
    kept for good held wide-64's output budget at the old limit for seven hours). The limits
    the success headers restate every window stay hard caps."""
    seed = Budgets(calls_per_s=50, tokens_per_s=25_000, output_tokens_per_s=None,
                   inflight_tokens=2e6)  # fmt: skip
    headers = {LimitType.REQUESTS: 3_000.0, LimitType.TOKENS: 1_500_000.0}
    s = initial_state(seed, 0.0, cached_input_counts=False, token_class="combined")
    s, a = window(
        s, 15.0, LimitType.OUTPUT_TOKENS,
        observed_limits={**headers, LimitType.OUTPUT_TOKENS: 60_000.0},
    )  # fmt: skip
    assert s.hard_caps[OUT] == pytest.approx(1_000.0)
    t, notes = 15.0, []
    while OUT in s.hard_caps and t < 4 * CFG.memory_s:
        assert s.budgets.output_tokens_per_s is not None
        assert s.budgets.output_tokens_per_s <= 1_000.0 + 1e-9
        t += 15.0
        s, a = window(s, t, observed_limits=headers)
        notes = list(a.notes)
    assert t == pytest.approx(15.0 + CFG.stated_cap_memory_s + 15.0)
    assert any("no longer a hard cap" in n for n in notes)
    for _ in range(int(2 * CFG.memory_s / 15.0)):
        t += 15.0
        s, _ = window(s, t, observed_limits=headers)
    assert s.budgets.output_tokens_per_s == pytest.approx(1_500.0)  # 1.5x the stated seed
    assert s.hard_caps[REQ] == pytest.approx(50.0)  # restated by every window's headers
    assert s.hard_caps[TOK] == pytest.approx(25_000.0)


def test_a_lapsed_limit_stated_again_by_a_429_caps_the_budget_again() -> None:
    """The re-probe of an unchanged limit draws a 429 that states it again: the cap is back,
    the budget is cut back under it, and the cap next lapses after the same memory, re-probe
    after re-probe. The stated limit stays the seed: the cuts under it are the provider's
    bucket refilling, not a limit that dropped (wide-721 of sim.generate_wide: two such cuts
    re-based the seed to 0.75x the stated limit and growth stalled at 1.5x that; a doubled
    memory held the budget at the old limit for 40 minutes after the provider raised it)."""
    seed = Budgets(calls_per_s=50, tokens_per_s=25_000, output_tokens_per_s=None,
                   inflight_tokens=2e6)  # fmt: skip
    stated = {LimitType.OUTPUT_TOKENS: 60_000.0}  # 1,000/s
    s = initial_state(seed, 0.0, cached_input_counts=False, token_class="combined")
    s, _ = window(s, 15.0, LimitType.OUTPUT_TOKENS, observed_limits=stated)
    t = 15.0
    for _ in range(3):
        s, t = clean_until(s, t, t + 2 * CFG.memory_s)
        assert OUT not in s.hard_caps
        probe = s.budgets.output_tokens_per_s
        assert probe is not None and probe > 1_000.0
        t += 15.0
        s, a = window(s, t, LimitType.OUTPUT_TOKENS, observed_limits=stated)
        assert OUT in a.cut and not a.rebased and s.hard_caps[OUT] == pytest.approx(1_000.0)
        cut_to = s.budgets.output_tokens_per_s
        assert cut_to is not None and cut_to <= 1_000.0  # cut as any 429 cuts, from the limit
        assert s.seed.output_tokens_per_s == pytest.approx(1_000.0)  # not re-based down
        assert s.level_memory_s.get(OUT, CFG.memory_s) == pytest.approx(CFG.memory_s)
        held, t_held = clean_until(s, t, t + 0.9 * CFG.memory_s)
        assert held.hard_caps[OUT] == pytest.approx(1_000.0)
        lapsed, _ = clean_until(held, t_held, t + 1.1 * CFG.memory_s)
        assert OUT not in lapsed.hard_caps  # re-probed after memory_s again, not twice that


def _with_headers(
    s: BudgetState, t: float, until: float, headers: dict[LimitType, float]
) -> tuple[BudgetState, float]:
    """Clean windows of 15 s from ``t`` until ``until``, each with these success headers."""
    while t < until:
        t += 15.0
        s, _ = window(s, t, observed_limits=headers)
    return s, t


def _openai_like() -> BudgetState:
    """A combined token class, no output seed: OpenAI, whose output limit only a 429 states."""
    seed = Budgets(calls_per_s=50, tokens_per_s=25_000, output_tokens_per_s=None,
                   inflight_tokens=2e6)  # fmt: skip
    return initial_state(seed, 0.0, cached_input_counts=False, token_class="combined")


def test_a_limit_a_429_states_raised_drops_the_429_level_drawn_under_the_old_one() -> None:
    """wide-353 of sim.generate_wide: OpenAI raised its output limit; the re-probe's 429 stated
    the new limit in its message, but the success headers between had forgotten the old one
    (they state requests and tokens only), so the raise went unseen. The re-probe was taken
    for one confirming the old 429 level: the budget was held under the old limit, 0.8x the
    stated one, for the doubled memory (80 minutes of 5,000 s)."""
    headers = {LimitType.REQUESTS: 3_000.0, LimitType.TOKENS: 1_500_000.0}
    s, _ = window(
        _openai_like(), 15.0, LimitType.OUTPUT_TOKENS,
        observed_limits={**headers, LimitType.OUTPUT_TOKENS: 60_000.0},  # 1,000/s
    )  # fmt: skip
    s, t = _with_headers(s, 15.0, 15.0 + 2 * CFG.memory_s, headers)  # cap and 429 level lapse
    assert OUT not in s.hard_caps and OUT not in s.observed
    probe = s.budgets.output_tokens_per_s
    assert probe is not None and 1_000.0 < probe <= 1_000.0 * CFG.reprobe_same
    raised = {**headers, LimitType.OUTPUT_TOKENS: 84_000.0}  # 1,400/s: the limit was raised
    s, a = window(s, t + 15.0, LimitType.OUTPUT_TOKENS, observed_limits=raised)
    assert any("stated limit raised" in n for n in a.notes)
    assert s.last_429_level[OUT] == pytest.approx(probe)  # drawn where the re-probe was
    s, _ = _with_headers(s, t + 15.0, t + 15.0 + 600.0, headers)
    assert s.budgets.output_tokens_per_s == pytest.approx(1_400.0)  # back up to the new limit


def test_a_429_stating_a_lowered_limit_starts_that_limit_afresh() -> None:
    """wide-300 and wide-239 of sim.generate_wide: OpenAI's output limit dropped and came back.
    The 429 that stated the lowered limit counted as a second cut below the seed with the cut
    under the old limit, and re-based the seed to 0.75x the limit it stated; and the memory
    its re-probes had doubled held the new, lower 429 level twice as long, so the raise back
    was found 40 minutes after the drop, not 20."""
    headers = {LimitType.REQUESTS: 3_000.0, LimitType.TOKENS: 1_500_000.0}
    old = {**headers, LimitType.OUTPUT_TOKENS: 60_000.0}  # 1,000/s
    s, _ = window(_openai_like(), 15.0, LimitType.OUTPUT_TOKENS, observed_limits=old)
    s, t = _with_headers(s, 15.0, 15.0 + 2 * CFG.memory_s, headers)
    s, _ = window(s, t + 15.0, LimitType.OUTPUT_TOKENS, observed_limits=old)  # a re-probe
    assert s.level_memory_s.get(OUT, CFG.memory_s) == pytest.approx(CFG.memory_s)
    t += 15.0 + 300.0  # the limit drops to 600/s; the next 429 states it
    lowered = {**headers, LimitType.OUTPUT_TOKENS: 36_000.0}
    s, a = window(s, t, LimitType.OUTPUT_TOKENS, observed_limits=lowered)
    assert OUT in a.cut and not a.rebased
    assert s.seed.output_tokens_per_s == pytest.approx(600.0)  # the stated limit, not a cut
    assert s.level_memory_s.get(OUT, CFG.memory_s) == pytest.approx(CFG.memory_s)
    s, t = _with_headers(s, t, t + CFG.memory_s + 30.0, headers)
    assert OUT not in s.hard_caps  # lapsed after memory_s: a raise back is looked for


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


def test_a_newly_stated_header_limit_lifts_a_low_budget_at_once() -> None:
    # stale config 4,000/s; the provider's headers say 16,000/s: no +5% crawl from 4,000
    low = initial_state(
        replace(SEED, tokens_per_s=4_000.0), 0.0, cached_input_counts=False, token_class="input"
    )
    stated = {LimitType.INPUT_TOKENS: 960_000.0}
    s, _ = window(low, 15.0, observed_limits=stated)
    assert s.budgets.tokens_per_s == pytest.approx(16_000.0)
    # a cut by a 429 is not undone by the same header on the next windows
    s, _ = window(s, 30.0, LimitType.INPUT_TOKENS, observed_limits=stated)
    cut = s.budgets.tokens_per_s
    assert cut < 16_000.0
    s, _ = window(s, 45.0, observed_limits=stated)
    assert s.budgets.tokens_per_s == cut


def test_a_changed_header_limit_stays_below_a_recent_429_level() -> None:
    # a 429 at 16,000/s below the 32,000/s the header states (another client of the key): a
    # lower limit stated later, still above that level, does not lift the budget past it
    s = fresh(0.0, observed_limits={LimitType.INPUT_TOKENS: 1_920_000.0})  # 32,000/s
    s = replace(s, budgets=s.budgets.with_value(BudgetClass.TOKENS, 16_000.0))
    s, _ = window(s, 15.0, LimitType.INPUT_TOKENS)  # 429 at 16,000/s
    lowered = {LimitType.INPUT_TOKENS: 1_440_000.0}  # the header now says 24,000/s
    s, _ = window(s, 30.0, observed_limits=lowered)
    assert s.budgets.tokens_per_s == pytest.approx(16_000.0 * (1 - CFG.probe_margin))


def test_a_raised_header_limit_drops_the_429_level_drawn_under_the_old_one() -> None:
    """wide-231 of sim.generate_wide: an output limit dropped, drew a 429, and came back; the
    headers said so, yet the budget waited out the 20-minute 429 memory below the old level."""
    s = fresh(0.0, observed_limits={LimitType.INPUT_TOKENS: 960_000.0})  # 16,000/s
    s, _ = window(s, 15.0, LimitType.INPUT_TOKENS)  # 429 at 16,000/s
    assert BudgetClass.TOKENS in s.last_429_level
    raised = {LimitType.INPUT_TOKENS: 1_920_000.0}  # the header now says 32,000/s
    s, actions = window(s, 30.0, observed_limits=raised)
    assert s.budgets.tokens_per_s == pytest.approx(32_000.0)
    assert BudgetClass.TOKENS not in s.last_429_level
    assert any("stated limit raised" in n for n in actions.notes)


def test_a_429_that_states_a_dropped_limit_lets_the_budget_back_up_to_it() -> None:
    """wide-258 of sim.generate_wide: the output limit halved; the 429 at the old level came
    with a header stating the new one. Remembered as drawn at the new limit, the 429 held the
    budget 5% under it for the 20-minute memory; it was drawn at the level before."""
    stated = {LimitType.INPUT_TOKENS: 1_200_000.0}  # 20,000/s
    s = fresh(0.0, observed_limits=stated)
    assert s.budgets.tokens_per_s == pytest.approx(20_000.0)
    halved = {LimitType.INPUT_TOKENS: 600_000.0}  # the limit drops to 10,000/s: a 429 says so
    s, _ = window(s, 15.0, LimitType.INPUT_TOKENS, observed_limits=halved)
    assert s.budgets.tokens_per_s == pytest.approx(10_000.0 * CFG.cut)
    assert s.last_429_level[TOK] == pytest.approx(20_000.0)
    s, _ = clean_until(s, 15.0, 15.0 + 600.0)  # well inside the 429 memory
    assert s.budgets.tokens_per_s == pytest.approx(10_000.0)  # the stated limit caps it
    # a 429 at the stated limit itself (no header lowered the budget) is remembered there
    s, _ = window(s, 700.0, LimitType.INPUT_TOKENS, observed_limits=halved)
    assert s.last_429_level[TOK] == pytest.approx(10_000.0)


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


USED = {cls: 0.95 for cls in BudgetClass}
USED_FULL = {cls: 1.0 for cls in BudgetClass}


def _run_clean(s: BudgetState, start: float, windows: int, **kw: object) -> BudgetState:
    for i in range(windows):
        s, _ = window(s, start + 15.0 * i, **kw)
    return s


def test_a_budget_used_clean_at_1_5x_its_seed_for_long_re_bases_it_up() -> None:
    """Rule 7: the provider accepted half as much again as the seed said, used and without a
    429, for ``rebase_up_s``: the seed was low (an operator's guess, a limit raised mid-run)."""
    s = _run_clean(fresh(), 15.0, 10, utilisation=USED)  # 1.05^9 > 1.5: at the ceiling
    assert s.budgets.calls_per_s == pytest.approx(75.0) and s.seed.calls_per_s == 50.0
    s = _run_clean(s, 165.0, int(CFG.rebase_up_s / 15.0) + 1, utilisation=USED)
    assert s.seed.calls_per_s > 50.0
    assert s.seed_source == "controller"
    top = s.seed.calls_per_s * CFG.max_over_seed
    s = _run_clean(s, 2000.0, 10, utilisation={c: 0.5 for c in BudgetClass})  # used, not held
    assert s.budgets.calls_per_s == pytest.approx(top)  # 1.5x the new seed


def test_a_re_base_up_keeps_the_rate_its_hold_proved() -> None:
    """Rule 7 re-bases the seed to the level it held, and keeps what the provider's
    acceptance proved (``BudgetState.proven_rate``): at most a full per-minute bucket and the
    rate since were accepted over the hold, so the limit is at least what it accepted / (hold
    + ``provider_burst_s``). The first proof is just past the old seed (that is when it ends
    the hold); a longer hold at a higher level proves more. ``earned_seed`` is the lower of
    the two. An operator's re-base forgets it; so does a limit a header states."""
    _, rebased_at = _first_rebase_up(1.0)
    s = _run_clean(fresh(), 15.0, int(rebased_at / 15.0), utilisation=USED_FULL)
    level = SEED.calls_per_s * CFG.max_over_seed
    assert s.seed.calls_per_s == pytest.approx(level)
    proven = s.proven_rate[BudgetClass.REQUESTS]
    assert SEED.calls_per_s <= proven <= 1.15 * SEED.calls_per_s
    assert s.earned_seed(BudgetClass.REQUESTS) == proven
    later = _run_clean(s, rebased_at + 15.0, 40, utilisation=USED_FULL)  # the next re-base up
    assert later.seed.calls_per_s > level
    assert later.proven_rate[BudgetClass.REQUESTS] > level  # 1.5x held long enough proves it
    assert rebase(s, SEED, rebased_at).proven_rate == {}
    stated = WindowObservation(now=rebased_at + 15.0, observed_limits={LimitType.REQUESTS: 3600.0})
    after, _ = step(s, stated, CFG)
    assert BudgetClass.REQUESTS not in after.proven_rate
    assert after.earned_seed(BudgetClass.REQUESTS) == pytest.approx(60.0)


def _first_rebase_up(
    utilisation: float,
    start: BudgetState | None = None,
    t: float = 15.0,
    over: float = CFG.max_over_seed,
    config: ControllerConfig = CFG,
) -> tuple[float, float]:
    """(when the request budget reached ``over`` x its seed, when its seed was re-based up),
    every window clean and the budgets used at ``utilisation``."""
    s, at_ceiling = start or fresh(), math.nan
    stop = t + 2000.0
    used = {c: utilisation for c in BudgetClass}
    while s.seed.calls_per_s == SEED.calls_per_s:
        s, _ = step(s, WindowObservation(now=t, utilisation=used), config)
        if math.isnan(at_ceiling) and s.budgets.calls_per_s >= over * SEED.calls_per_s * (1 - 1e-9):
            at_ceiling = t
        t += 15.0
        assert t < stop, "never re-based up"
    return at_ceiling, t - 15.0


@pytest.mark.parametrize("utilisation", [1.0, 0.95, 0.85, 0.8])
def test_a_re_base_up_comes_once_the_acceptance_proves_the_seed(utilisation: float) -> None:
    """Rule 7's hold ends when the provider has accepted more than a full per-minute bucket
    and the seed's rate could have served since the hold began (``provider_burst_s``): at
    1.5x the seed fully used after 120 s, at 0.95 of it after 141 s; at 0.8 that takes the
    300 s of ``rebase_up_s``. Never earlier: the bucket may have been full."""
    at_ceiling, rebased = _first_rebase_up(utilisation)
    proof_s = CFG.provider_burst_s / (CFG.max_over_seed * utilisation - 1.0)
    hold = min(CFG.rebase_up_s, 15.0 * math.ceil(proof_s / 15.0 - 1e-9))
    assert rebased - at_ceiling == pytest.approx(hold)


def test_a_re_base_up_proof_needs_more_than_a_full_bucket_could_serve() -> None:
    """Counting the bucket's depth matters: without it 1.5x the seed used would prove the
    seed after ``rebase_up_min_s``, when a full bucket alone could have served it."""
    at_ceiling, rebased = _first_rebase_up(1.0, config=replace(CFG, provider_burst_s=0.0))
    assert rebased - at_ceiling == pytest.approx(CFG.rebase_up_min_s)
    at_ceiling, rebased = _first_rebase_up(1.0)
    assert rebased - at_ceiling == pytest.approx(120.0)


def test_a_stale_seed_waits_out_the_hold_however_much_is_accepted() -> None:
    """At ``stale_max_over_seed`` x a stale seed the proof of the seed would come after
    ``rebase_up_min_s`` (3x used against 1x and a full bucket) while the level may be well
    above the limit (``tr-stale-low-none``: held at 1.05x its limit, re-based up after two
    minutes, the climb drew a 429 storm); a stale seed is re-based up after ``rebase_up_s``."""
    hours7 = 7 * 3600.0
    stale = fresh(now=hours7, seeded_at=0.0)
    at_ceiling, rebased = _first_rebase_up(1.0, stale, hours7 + 15.0, over=CFG.stale_max_over_seed)
    assert rebased - at_ceiling == pytest.approx(CFG.rebase_up_s)


@pytest.mark.parametrize(
    "case", ["unused", "no-utilisation", "header-limit", "recent-429", "interrupted"]
)
def test_a_budget_is_not_re_based_up_without_clean_evidence(case: str) -> None:
    util = dict(USED)
    s = fresh()
    if case == "unused":
        util[BudgetClass.REQUESTS] = 0.5
    if case == "header-limit":
        s = fresh(observed_limits={LimitType.REQUESTS: 4500.0})  # 75/s stated: a hard cap
    if case == "recent-429":
        s, _ = window(s, 15.0, LimitType.REQUESTS)  # drew a 429 at 50/s
        s = replace(s, budgets=s.budgets.with_value(BudgetClass.REQUESTS, 50.0))
    kw: dict[str, object] = {} if case == "no-utilisation" else {"utilisation": util}
    windows = int(3 * CFG.rebase_up_s / 15.0)
    # interrupted (used at 10%) once per the hold that used at 0.95 proves the seed in (rule
    # 7), less one window
    proof_s = CFG.provider_burst_s / (CFG.max_over_seed * util[BudgetClass.REQUESTS] - 1.0)
    period = int(proof_s / 15.0) - 1
    for i in range(windows):
        now = 60.0 + 15.0 * i
        if case == "interrupted" and i % period == period - 1:
            s, _ = window(s, now, utilisation={**util, BudgetClass.REQUESTS: 0.1})
        else:
            s, _ = window(s, now, **kw)
    assert s.seed.calls_per_s == pytest.approx(75.0 if case == "header-limit" else 50.0)
    assert s.budgets.calls_per_s <= 75.0 + 1e-9
