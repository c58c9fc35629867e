"""The budget controller and the limits a provider states (rule 1): the seed and hard cap
from success headers or a 429's message, and how a stated limit lapses, rises or drops."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.budgets import (
    BudgetClass,
    Budgets,
    BudgetState,
    initial_state,
)
from planner.classify import LimitType
from tests.budget_support import CFG, OUT, REQ, SEED, TOK, clean_until, fresh, window


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
    the budget is cut back under it, and the cap next lapses after twice the last memory, up
    to ``memory_s`` (5, 10, 15, 15 minutes): the re-probes of an unchanged limit come ever
    more rarely, each cutting the budget to 0.75x it (wide-5736: 18 429s at 5 minutes each,
    against 0.1% of its calls, 10). Not past ``memory_s``: a memory doubled to 40 minutes held
    wide-721's budget at the old limit that long after the provider raised it. The stated
    limit stays the seed: the cuts under it are the provider's bucket refilling, not a limit
    that dropped (wide-721: two such cuts re-based the seed to 0.75x the stated limit and
    growth stalled at 1.5x that)."""
    seed = Budgets(calls_per_s=50, tokens_per_s=25_000, output_tokens_per_s=None,
                   inflight_tokens=2e6)  # fmt: skip
    stated = {LimitType.OUTPUT_TOKENS: 60_000.0}  # 1,000/s
    s = initial_state(seed, 0.0, cached_input_counts=False, token_class="combined")
    s, _ = window(s, 15.0, LimitType.OUTPUT_TOKENS, observed_limits=stated)
    t = 15.0
    memory = CFG.stated_cap_memory_s
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
        memory = min(2 * memory, CFG.memory_s)
        assert s.level_memory_s.get(OUT, CFG.memory_s) == pytest.approx(memory)
        held, t_held = clean_until(s, t, t + 0.9 * memory)
        assert held.hard_caps[OUT] == pytest.approx(1_000.0)
        lapsed, _ = clean_until(held, t_held, t + 1.1 * memory)
        assert OUT not in lapsed.hard_caps  # re-probed after this memory, not later


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
    s, _ = _with_headers(s, t + 15.0, t + 15.0 + 0.9 * CFG.stated_cap_memory_s, headers)
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
    memory = CFG.stated_cap_memory_s
    assert s.level_memory_s.get(OUT, CFG.memory_s) == pytest.approx(2 * memory)  # doubled
    t += 15.0 + memory / 3  # the limit drops to 600/s; the next 429 states it
    lowered = {**headers, LimitType.OUTPUT_TOKENS: 36_000.0}
    s, a = window(s, t, LimitType.OUTPUT_TOKENS, observed_limits=lowered)
    assert OUT in a.cut and not a.rebased
    assert s.seed.output_tokens_per_s == pytest.approx(600.0)  # the stated limit, not a cut
    assert s.level_memory_s.get(OUT, CFG.memory_s) == pytest.approx(memory)  # afresh
    s, t = _with_headers(s, t, t + memory + 30.0, headers)
    assert OUT not in s.hard_caps  # lapsed after its memory: a raise back is looked for


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
    inside = 15.0 + 0.8 * CFG.stated_cap_memory_s  # inside the 429 memory and the cap's
    s, _ = clean_until(s, 15.0, inside)
    assert s.budgets.tokens_per_s == pytest.approx(10_000.0)  # the stated limit caps it
    # a 429 at the stated limit itself (no header lowered the budget) is remembered there
    s, _ = window(s, inside + 15.0, LimitType.INPUT_TOKENS, observed_limits=halved)
    assert s.last_429_level[TOK] == pytest.approx(10_000.0)


def test_a_429_drawn_at_or_above_a_limit_it_states_lets_growth_back_to_that_limit() -> None:
    """wide-2574 and wide-2563 of sim.generate_wide: OpenAI states its output limit only in a
    429's message, and the alias had no output budget, so the first 429 was drawn unpaced.
    Remembered at the stated limit, it held growth 5% under that limit for the 429 memory:
    the output budget sat at 0.95x a limit the provider had stated, and a fixed fleet that
    stormed it finished 7% sooner. A 429 drawn at or above a stated limit says no more than
    the statement: growth goes back to the limit itself. One drawn under it still holds growth
    5% under its own level."""
    headers = {LimitType.REQUESTS: 3_000.0, LimitType.TOKENS: 1_500_000.0}
    stated = {**headers, LimitType.OUTPUT_TOKENS: 60_000.0}  # 1,000/s
    s, _ = window(_openai_like(), 15.0, LimitType.OUTPUT_TOKENS, observed_limits=stated)
    assert s.budgets.output_tokens_per_s == pytest.approx(1_000.0 * CFG.cut)
    inside = 15.0 + 0.9 * CFG.stated_cap_memory_s  # inside the 429 memory and the stated cap's
    s, _ = _with_headers(s, 15.0, inside, headers)
    assert s.remembers_429_level(OUT, inside, CFG) and OUT in s.hard_caps
    assert s.budgets.output_tokens_per_s == pytest.approx(1_000.0)
    # under a limit the success headers state (Anthropic), a 429 at 900/s is our own overdraw
    anthropic = {LimitType.INPUT_TOKENS: 1_200_000.0, LimitType.OUTPUT_TOKENS: 60_000.0}
    seed = Budgets(calls_per_s=50, tokens_per_s=25_000, output_tokens_per_s=900.0,
                   inflight_tokens=2e6)  # fmt: skip
    s = initial_state(seed, 0.0, cached_input_counts=False, token_class="input")
    s, _ = window(s, 15.0, observed_limits=anthropic)
    s = replace(s, budgets=s.budgets.with_value(OUT, 900.0))
    s, _ = window(s, 30.0, LimitType.OUTPUT_TOKENS, observed_limits=anthropic)
    assert s.last_429_level[OUT] == pytest.approx(900.0)
    s, _ = _with_headers(s, 30.0, 30.0 + 0.9 * CFG.stated_cap_memory_s, anthropic)
    assert s.budgets.output_tokens_per_s == pytest.approx(900.0 * (1 - CFG.probe_margin))
