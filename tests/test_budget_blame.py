"""The budget controller's blame of a 429 (rule 4 of ``planner.budgets``, ``planner.blame``):
which class a 429 of an unknown limit is put on, what is measured of it, and how long a guess
is held. Split from ``test_budgets.py``; the helpers are shared through ``budget_support``."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.budgets import (
    BudgetClass,
    BudgetState,
    ControllerConfig,
    WindowObservation,
    step,
)
from planner.classify import LimitType
from tests.budget_support import CFG, OUT, REQ, SEED, TOK, clean_until, fresh, window


def test_an_unknown_repeated_429_measures_only_the_most_pressed_class() -> None:
    first, _ = window(fresh(), 15.0, LimitType.UNKNOWN)
    # tokens accepted at ~60% of their budget, requests at 10%: tokens are the limit hit
    accepted = {
        BudgetClass.TOKENS: 0.6 * first.budgets.tokens_per_s,
        BudgetClass.REQUESTS: 0.1 * first.budgets.calls_per_s,
        BudgetClass.OUTPUT_TOKENS: 0.2 * (first.budgets.output_tokens_per_s or 0.0),
    }
    s, _ = window(first, 15.0 + CFG.cooldown_s, LimitType.UNKNOWN, delivered=accepted)
    assert s.budgets.tokens_per_s == pytest.approx(
        accepted[BudgetClass.TOKENS] * (1 - CFG.probe_margin)
    )
    assert s.budgets.calls_per_s == pytest.approx(first.budgets.calls_per_s * CFG.cut)


def test_an_unknown_429_caps_only_the_pressed_class_below_its_level() -> None:
    """An unknown 429 cuts every budget (any may be the limit hit), but only the class the
    provider accepted most of draws the 429: the others' levels stay allowed. A naive
    controller remembers every level, and a token limit's 429s keep the request budget
    below 0.95x its pre-429 level for an hour, though the request limit was never hit."""
    start = fresh()
    accepted = {
        BudgetClass.TOKENS: 0.98 * start.budgets.tokens_per_s,
        BudgetClass.REQUESTS: 0.4 * start.budgets.calls_per_s,
        BudgetClass.OUTPUT_TOKENS: 0.3 * (start.budgets.output_tokens_per_s or 0.0),
    }
    s, a = window(start, 15.0, LimitType.UNKNOWN, delivered=accepted)
    assert set(a.cut) == set(BudgetClass)  # every budget is cut ...
    assert s.budgets.calls_per_s == pytest.approx(SEED.calls_per_s * CFG.cut)
    assert set(s.last_429_level) == {BudgetClass.TOKENS}  # ... only tokens drew the 429
    assert s.cuts_below_seed.get(BudgetClass.REQUESTS, ()) == ()  # no re-base count
    s, _ = clean_until(s, 15.0, 15.0 + CFG.unchecked_memory_s - CFG.window_s)
    assert s.budgets.calls_per_s > SEED.calls_per_s  # regrown past the level of the 429
    assert s.budgets.tokens_per_s == pytest.approx(
        SEED.tokens_per_s * (1 - CFG.probe_margin)
    )  # the level that drew it stays capped


def test_an_unknown_429_with_nothing_measured_blames_every_class() -> None:
    s, _ = window(fresh(), 15.0, LimitType.UNKNOWN)
    assert set(s.last_429_level) == set(BudgetClass)
    s, _ = clean_until(s, 15.0, 15.0 + CFG.unchecked_memory_s - CFG.window_s)
    assert s.budgets.calls_per_s == pytest.approx(SEED.calls_per_s * (1 - CFG.probe_margin))


def test_a_guessed_blame_is_remembered_briefly_a_named_one_for_the_full_memory() -> None:
    """Without headers the class an unknown 429 is put on is a guess (the share rule's): a
    wrong one held a token budget at half the provider's token limit for twenty minutes
    while the 429s were the output limit's (``issue-example-none-out-tight``). Its level caps
    growth for ``unchecked_memory_s`` only; a 429 that names the class, for ``memory_s``; a
    re-probe that draws a 429 at about the guessed level confirms it (twice as long)."""
    assert CFG.unchecked_memory_s < CFG.memory_s
    accepted = {BudgetClass.TOKENS: 24_000.0, BudgetClass.REQUESTS: 10.0}
    guessed, _ = window(fresh(), 15.0, LimitType.UNKNOWN, delivered=accepted)
    named, _ = window(fresh(), 15.0, LimitType.INPUT_TOKENS, delivered=accepted)
    assert guessed.last_429_level == named.last_429_level == {TOK: SEED.tokens_per_s}
    assert guessed.level_memory_s[TOK] == CFG.unchecked_memory_s
    assert named.level_memory_s[TOK] == CFG.memory_s
    cap = SEED.tokens_per_s * (1 - CFG.probe_margin)
    until = 15.0 + CFG.unchecked_memory_s + 2 * CFG.window_s
    guessed, t = clean_until(guessed, 15.0, until)
    named, _ = clean_until(named, 15.0, until)
    assert named.budgets.tokens_per_s == pytest.approx(cap)  # still held
    assert guessed.budgets.tokens_per_s > SEED.tokens_per_s  # re-probing past the guess
    t += CFG.window_s
    again = {BudgetClass.TOKENS: guessed.budgets.tokens_per_s, BudgetClass.REQUESTS: 10.0}
    guessed, _ = window(guessed, t, LimitType.UNKNOWN, delivered=again)
    assert guessed.last_429_level[TOK] == SEED.tokens_per_s  # confirmed: the old level
    assert guessed.level_memory_s[TOK] == 2 * CFG.unchecked_memory_s
    # the naive controller holds the guess as long as a named limit
    naive = replace(CFG, unchecked_memory_s=CFG.memory_s)
    held, _ = step(fresh(), WindowObservation(now=15.0, throttles=((LimitType.UNKNOWN, None),),
                   delivered=accepted), naive)  # fmt: skip
    assert held.level_memory_s[TOK] == CFG.memory_s


def _unknown_429s(
    cfg: ControllerConfig,
    rates: list[dict[BudgetClass, float]],
    start: float = 15.0,
    drained: list[dict[BudgetClass, float]] | None = None,
) -> tuple[BudgetState, list[str]]:
    """A 429 of an unknown limit every 120 s, the provider having accepted ``rates`` over the
    last cooldown (and drained its buckets at ``drained``, when given)."""
    s = fresh()
    notes: list[str] = []
    for i, accepted in enumerate(rates):
        obs = WindowObservation(
            now=start + 120.0 * i,
            throttles=((LimitType.UNKNOWN, None),),
            delivered=accepted,
            drained=drained[i] if drained else None,
        )
        s, actions = step(s, obs, cfg)
        notes.extend(actions.notes)
    return s, notes


def test_an_unknown_429s_blame_goes_to_the_class_accepted_steadily_not_the_cut_one() -> None:
    """A wrong blame feeds itself: the output budget, blamed and cut, becomes the class used
    most relative to its budget, so a naive controller blames it at every 429 of the token
    limit and cuts it far below the provider's output limit. Here the provider accepts ~16k
    tokens/s at each 429 (its token limit; the token seed of 25k was high) while the output
    it accepts falls with each cut of the output budget: tokens are blamed, and output's 429
    memory is dropped."""
    outputs = [4_900.0, 3_700.0, 2_900.0, 2_300.0]
    rates = [
        {TOK: tok, REQ: 10.0 * out / 4_900.0, OUT: out}
        for tok, out in zip([16_000.0, 15_400.0, 16_300.0, 15_800.0], outputs, strict=True)
    ]
    s, notes = _unknown_429s(CFG, rates)
    assert set(s.last_429_level) == {TOK}
    assert any(n.startswith("output_tokens: unknown 429s hit the tokens limit") for n in notes)
    naive, _ = _unknown_429s(replace(CFG, blame_samples=0), rates)
    assert OUT in naive.last_429_level  # the highest share of its budget: blamed, remembered


def test_an_unknown_429s_blame_reads_the_drained_buckets_not_the_bursts() -> None:
    """A request limit of ~40 calls/s binds. After each quiet spell the provider's full bucket
    lets a burst through, so the rates accepted over the last cooldown read 73, 49, 45 and 76
    calls/s at its 429s, no steadier than the tokens (growing with the tasks' contexts). The
    rate at which each bucket was drained (``planner.drain``) reads the request limit at each
    429: requests are blamed. From the bursts alone the token budget takes the blame
    (random-1439: its seed re-based to a third of the provider's token limit)."""
    bursts = [{REQ: r, TOK: t, OUT: o} for r, t, o in [
        (73.0, 19_000.0, 2_000.0), (49.0, 16_000.0, 1_900.0),
        (45.0, 17_500.0, 1_800.0), (76.0, 26_000.0, 2_600.0)]]  # fmt: skip
    drained = [{REQ: r, TOK: t, OUT: o} for r, t, o in [
        (39.5, 14_000.0, 1_500.0), (40.0, 15_500.0, 1_450.0),
        (39.8, 17_000.0, 1_600.0), (40.1, 19_000.0, 1_550.0)]]  # fmt: skip
    s, _ = _unknown_429s(CFG, bursts, drained=drained)
    assert set(s.last_429_level) == {REQ}
    naive, _ = _unknown_429s(CFG, bursts)
    assert TOK in naive.last_429_level


def test_an_unknown_429s_blame_is_not_fooled_by_the_mix_of_calls() -> None:
    """The request limit binds (~1.6 calls/s accepted at each 429) while tokens per call grow
    as the tasks age: the accepted token rate climbs, and with a low token budget tokens use
    the highest share of theirs. The steady class, requests, is blamed."""
    rates = [{REQ: r, TOK: t, OUT: 300.0 * r}
             for r, t in [(1.6, 12_000.0), (1.55, 16_000.0), (1.65, 21_000.0), (1.6, 24_000.0)]]  # fmt: skip
    low_tokens = replace(fresh(), budgets=replace(SEED, tokens_per_s=20_000.0, calls_per_s=2.0))
    s = low_tokens
    for i, accepted in enumerate(rates):
        obs = WindowObservation(
            now=15.0 + 120.0 * i, throttles=((LimitType.UNKNOWN, None),), delivered=accepted
        )
        s, _ = step(s, obs, CFG)
    assert set(s.last_429_level) == {REQ}


def _regrown(s: BudgetState, now: float) -> tuple[BudgetState, float]:
    """40 clean windows (every budget grows back to its cap), and the time of the next one."""
    for _ in range(40):
        now += 15.0
        s, _ = step(s, WindowObservation(now=now), CFG)
    return s, now + 15.0


def test_steady_rates_do_not_overrule_a_share_blame_pressed_above_its_seed() -> None:
    """The request limit binds: at each unknown 429 the provider accepted (about) all the calls
    the request budget allowed, and growth re-probes a little under the last 429's level, above
    the seed. The token rate it accepted happens to hold steadier (a fleet the request limit
    holds still sends a steady token rate). Outside the share rule's loop (the blamed class
    below its seed, or re-based down on the share rule alone) steadiness does not overrule
    it: requests stay blamed and keep their 429 memory (dropping it re-probes the request
    limit already found, and draws 429s a fixed fleet as fast does not)."""
    tokens = [16_000.0, 16_500.0, 16_200.0, 15_900.0]
    outputs = [6_000.0, 5_800.0, 5_200.0, 5_000.0]
    notes: list[str] = []
    s, now = fresh(), 0.0
    for tok, out in zip(tokens, outputs, strict=True):
        s, now = _regrown(s, now)
        calls = s.budgets.calls_per_s
        assert calls >= SEED.calls_per_s
        accepted = {REQ: 0.98 * calls, TOK: tok, OUT: out}
        obs = WindowObservation(now=now, throttles=((LimitType.UNKNOWN, None),), delivered=accepted)
        s, actions = step(s, obs, CFG)
        notes.extend(actions.notes)
    assert len(s.unknown_samples) == 4
    assert set(s.last_429_level) == {REQ}
    assert not any("429 memory is dropped" in n for n in notes)


def test_steady_drained_rates_overrule_a_share_blame_pressed_above_its_seed() -> None:
    """The token limit binds, and the output budget, grown above its seed, is the one the
    provider accepted most of relative to its budget at each unknown 429 (bursts after each
    cut). Read as how fast each bucket was drained, tokens hold steady at the limit while
    output falls with each cut of it: tokens are blamed, above the seed or not. Where only
    the rates over the last cooldown are known, the share rule stands there, and output is
    cut at every 429 (random-1121: the output budget cut to a fifth of its seed, ratio 1.23)."""
    drained_tokens = [16_000.0, 16_300.0, 15_900.0, 16_100.0]
    # high enough that output, held under drained_memory_over x its drained rate, regrows
    # above its seed
    drained_outputs = [6_400.0, 6_000.0, 5_600.0, 5_300.0]

    def run(with_drained: bool) -> BudgetState:
        s, now = fresh(), 0.0
        for tok, out in zip(drained_tokens, drained_outputs, strict=True):
            s, now = _regrown(s, now)
            budgets = s.budgets
            assert (budgets.output_tokens_per_s or 0.0) > (SEED.output_tokens_per_s or 0.0)
            burst = {
                REQ: 0.5 * budgets.calls_per_s,
                TOK: 0.8 * budgets.tokens_per_s,
                OUT: 1.1 * (budgets.output_tokens_per_s or 0.0),
            }
            drained = {REQ: out / 200.0, TOK: tok, OUT: out}  # calls move with output
            obs = WindowObservation(
                now=now,
                throttles=((LimitType.UNKNOWN, None),),
                delivered=burst,
                drained=drained if with_drained else None,
            )
            s, _ = step(s, obs, CFG)
        return s

    assert TOK in run(with_drained=True).last_429_level
    assert TOK not in run(with_drained=False).last_429_level


def test_a_fleets_steady_calls_do_not_take_the_blame_from_a_limit_drained_as_steadily() -> None:
    """An output limit binds and holds the fleet still: at its 429s the output bucket is
    drained at its limit (within 1%) and the calls at a steady 2.6/s (within 0.5%). Spreads
    that small are noise (``blame_spread_floor``): the two are tied, and the share rule blames
    output, the class pressed against its budget. Without the floor the calls, a hair steadier,
    take the blame and the request budget is cut to a quarter of its seed (random-413)."""
    drained = [{REQ: r, TOK: t, OUT: o} for r, t, o in [
        (2.60, 15_800.0, 3_899.0), (2.61, 16_800.0, 3_960.0),
        (2.60, 18_300.0, 3_989.0), (2.61, 19_400.0, 3_996.0)]]  # fmt: skip
    pressed = [{REQ: 0.2 * SEED.calls_per_s, TOK: 0.6 * SEED.tokens_per_s, OUT: 4_100.0}] * 4
    s, _ = _unknown_429s(CFG, pressed, drained=drained)
    assert OUT in s.last_429_level and REQ not in s.last_429_level
    no_floor, _ = _unknown_429s(replace(CFG, blame_spread_floor=0.0), pressed, drained=drained)
    assert REQ in no_floor.last_429_level


def test_a_limit_drained_within_half_a_percent_is_told_from_calls_within_two() -> None:
    """An output limit binds: at its 429s the output bucket drains at its limit (within
    0.5%), while the calls, which the output per call moves, drain within 2%, and the tokens
    move with the tasks' contexts. Under a floor of 3% the two were tied and the share rule
    blamed the requests, used most relative to their budget: each 429 cut the request budget
    and counted towards re-basing its seed down, while the output limit went on drawing 429s
    (header-less wide runs of batches thirty-one to thirty-three, docs/bench-planner.md,
    fifty-fourth round). A floor of 1% tells them apart: output takes the blame."""
    drained = [{REQ: r, TOK: t, OUT: o} for r, t, o in [
        (2.60, 15_800.0, 3_900.0), (2.66, 17_800.0, 3_920.0),
        (2.55, 19_300.0, 3_890.0), (2.68, 21_400.0, 3_910.0)]]  # fmt: skip
    pressed = [{REQ: 0.9 * SEED.calls_per_s, TOK: 0.6 * SEED.tokens_per_s, OUT: 0.8 * 4_100.0}] * 4
    s, _ = _unknown_429s(CFG, pressed, drained=drained)
    assert OUT in s.last_429_level and REQ not in s.last_429_level
    coarse, _ = _unknown_429s(replace(CFG, blame_spread_floor=0.03), pressed, drained=drained)
    assert REQ in coarse.last_429_level


def test_too_few_or_equally_steady_samples_keep_the_share_rule() -> None:
    """Before ``blame_min_samples`` unknown 429s, or when no class is clearly steadier, the
    blame stays on the class used most relative to its budget."""
    two, _ = _unknown_429s(CFG, [{TOK: 24_000.0, REQ: 20.0, OUT: 2_000.0}] * 2)
    assert set(two.last_429_level) == {TOK}
    same = [{TOK: 24_000.0 * f, REQ: 20.0 * f, OUT: 2_000.0 * f} for f in (1.0, 0.6, 0.8, 0.5)]
    s, _ = _unknown_429s(CFG, same)  # every class moved together: the limit itself dropped
    assert set(s.last_429_level) == {TOK}
    assert len(s.unknown_samples) == 4


def test_a_seed_re_based_up_counts_in_the_share_loop_only_as_far_as_it_was_proven() -> None:
    """Rule 7 re-bases a seed up to the level it held, though what the provider accepted
    proved only a lower rate (a full per-minute bucket and that rate since). Taken at its
    word, such a seed puts a token budget pressed at its limit "below its seed": the share
    rule looks to be in its loop, and the request rate, steady because the fleet's demand is,
    overrules it. The requests draw the blame and the tokens' 429 memory is dropped, so the
    token budget re-probes above its limit at once (random-212: four more 429s). Measured
    against the proven rate, the token budget is above what it earned: the share rule stands
    and the tokens keep the blame."""
    rebased = replace(
        fresh(),
        seed=replace(SEED, tokens_per_s=37_500.0),  # rule 7: 1.5x the operator's 25,000
        proven_rate={TOK: 26_000.0},
    )

    def blamed(state: BudgetState) -> set[BudgetClass]:
        s = state
        # the unknown 429s of one episode each: the token budget pressed at the level it
        # reached (over the seed, then twice under it after the cuts), the fleet's request
        # rate steady at 0.6 of its budget
        for i, (level, share) in enumerate([(50_000.0, 1.0), (36_000.0, 0.93), (34_000.0, 0.97)]):
            s = replace(s, budgets=replace(s.budgets, tokens_per_s=level, calls_per_s=50.0))
            accepted = {TOK: share * level, REQ: 30.0, OUT: 2_000.0 * share}
            obs = WindowObservation(
                now=15.0 + 120.0 * i, throttles=((LimitType.UNKNOWN, None),), delivered=accepted
            )
            s, _ = step(s, obs, CFG)
        return set(s.last_429_level)

    assert blamed(rebased) == {TOK}
    # the seed taken at its word: a steady class (requests, or output as steady within the
    # noise floor) takes the blame from the tokens
    assert TOK not in blamed(replace(rebased, proven_rate={}))


def _reprobe_of_a_request_limit(drained_at_reprobe: float | None) -> tuple[BudgetState, float]:
    """A request budget of 40 calls/s draws an unknown 429 where 38 calls/s were drained
    (tokens far below theirs: requests take the blame); after its memory lapsed, a re-probe at
    1.4x the old level draws the next one, the requests drained at ``drained_at_reprobe``.
    The state after it, and the memory the first 429 left."""

    def drained(requests: float) -> dict[BudgetClass, float]:
        return {REQ: requests, TOK: 4_000.0, OUT: 400.0}

    s = replace(fresh(), budgets=replace(SEED, calls_per_s=40.0))
    s, _ = window(s, 15.0, LimitType.UNKNOWN, delivered=drained(38.0), drained=drained(38.0))
    assert set(s.last_429_level) == {REQ}
    first_memory = s.level_memory_s[REQ]
    s, t = clean_until(s, 15.0, 15.0 + first_memory + 45.0)
    s = replace(s, budgets=replace(s.budgets, calls_per_s=1.4 * 40.0))
    rates = None if drained_at_reprobe is None else drained(drained_at_reprobe)
    s, _ = window(s, t + 15.0, LimitType.UNKNOWN, delivered=rates, drained=rates)
    return s, first_memory


def test_a_reprobe_that_drained_more_than_the_old_level_allowed_found_a_raised_limit() -> None:
    """Without headers a re-probe's level says little: the provider's full per-minute bucket
    lets it climb up to 1.75x an unchanged limit, so a 429 at 1.4x the old level confirms it.
    How fast the bucket was drained says more: 52 calls/s drained against an old level of 40
    is a limit raised, and the level the drain reads is remembered, with the first memory
    (wide-638: its request limit rose by a third; taken as confirmed, the old level held the
    budget at three quarters of the new limit for the last hour of the run). 38.5 calls/s
    drained is the old limit confirmed: the old level stays and its memory doubles."""
    raised, first_memory = _reprobe_of_a_request_limit(52.0)
    served = 52.0 / (1 - CFG.probe_margin)
    assert raised.last_429_level[REQ] == pytest.approx(served)
    assert raised.level_memory_s[REQ] == first_memory
    assert raised.budgets.calls_per_s == pytest.approx(served * CFG.cut)
    unchanged, _ = _reprobe_of_a_request_limit(38.5)
    assert unchanged.last_429_level[REQ] == 40.0
    assert unchanged.level_memory_s[REQ] == 2 * first_memory
    assert unchanged.budgets.calls_per_s == pytest.approx(40.0 * CFG.cut)
    # read from the level alone (no drained rates), the raised limit is taken as confirmed
    naive, _ = _reprobe_of_a_request_limit(None)
    assert naive.last_429_level[REQ] == 40.0


def test_an_unknown_429_remembers_the_level_its_bucket_drained_at_not_the_level_reached() -> None:
    """A per-minute bucket lets a budget climb well past the limit before it empties, so the
    level a 429 was drawn at can be far above the limit; regrown to it, the budget draws the
    next 429. Where the 429 named no limit, the drained rate of the class it blames reads about
    the limit: at most ``drained_memory_over`` x it is remembered (not below two cuts under the
    level: a guess's drained rate may be far under any limit of its class). wide-819
    remembered 1.9x its token limit, and its re-probes drew 32 429s."""
    rates = {REQ: 20.0, TOK: 4_000.0, OUT: 400.0}  # requests the most drained: blamed
    s = replace(fresh(), budgets=replace(SEED, calls_per_s=45.0))
    s, _ = window(s, 15.0, LimitType.UNKNOWN, delivered=rates, drained=rates)
    remembered = 20.0 * CFG.drained_memory_over
    assert s.last_429_level[REQ] == pytest.approx(remembered)
    assert s.budgets.calls_per_s == pytest.approx(remembered * CFG.cut)
    # a guess (one 429, the share rule alone): remembered for unchecked_memory_s
    regrown, _ = clean_until(s, 15.0, 15.0 + CFG.unchecked_memory_s - CFG.window_s)
    assert regrown.budgets.calls_per_s == pytest.approx(remembered * (1 - CFG.probe_margin))
    # a drained rate far under the level: at most two cuts are taken from the level
    low = {REQ: 5.0, TOK: 1_000.0, OUT: 100.0}
    s = replace(fresh(), budgets=replace(SEED, calls_per_s=45.0))
    s, _ = window(s, 15.0, LimitType.UNKNOWN, delivered=low, drained=low)
    assert s.last_429_level[REQ] == pytest.approx(45.0 * CFG.cut * CFG.cut)
    # read from the level alone (no drained rates), the budget regrows to the level of the 429
    naive = replace(fresh(), budgets=replace(SEED, calls_per_s=45.0))
    naive, _ = window(naive, 15.0, LimitType.UNKNOWN, delivered=rates)
    naive, _ = clean_until(naive, 15.0, 15.0 + CFG.unchecked_memory_s - CFG.window_s)
    assert naive.budgets.calls_per_s == pytest.approx(45.0 * (1 - CFG.probe_margin))
