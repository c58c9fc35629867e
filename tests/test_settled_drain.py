"""A re-probe judged at the tick on a drained rate short by its calls in flight is judged again
once they are answered (``planner.settled_drain``). Each test fails on the controller before it:
a limit raised mid-run, no header to say so, read as unchanged at every re-probe, held growth
under the old level while the memory doubled (wide-2879: ratio 1.21, 1.14 with the settlement)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner.budgets import BudgetState
from planner.classify import LimitType
from planner.settled_drain import SETTLE_WITHIN_S
from tests.budget_support import CFG, SEED, TOK, clean_until, fresh, window

OLD = 20_000.0  # the level the first 429 left remembered
REPROBE = 1.4 * OLD  # where the re-probe's 429 came: within reprobe_same of the old level


def reprobed(drained: float) -> tuple[BudgetState, float]:
    """A first 429 at ``OLD``, clean windows until its memory lapsed, then a re-probe's 429 at
    ``REPROBE`` with the bucket drained at ``drained`` as the tick read it. The state, the time."""
    s = replace(fresh(), budgets=replace(SEED, tokens_per_s=OLD))
    s, _ = window(s, 15.0, LimitType.TOKENS, drained={TOK: 0.95 * OLD})
    s, t = clean_until(s, 15.0, 15.0 + CFG.memory_s + 45.0)
    s = replace(s, budgets=replace(s.budgets, tokens_per_s=REPROBE))
    t += 15.0
    s, _ = window(s, t, LimitType.TOKENS, drained={TOK: drained})
    return s, t


def test_a_reprobe_read_as_unchanged_waits_for_its_calls_in_flight() -> None:
    # read at the tick: served 20,500 / 0.95 = 21,579, not reprobe_rise (1.1) x the old level
    s, t = reprobed(20_500.0)
    assert s.last_429_level[TOK] == OLD
    assert s.level_memory_s[TOK] == 2 * CFG.memory_s
    assert s.unsettled_reprobe == {TOK: (t, REPROBE, OLD)}


def test_settled_above_the_rise_the_raised_limit_is_remembered_and_grown_to() -> None:
    s, t = reprobed(20_500.0)
    s, _ = window(s, t + 15.0, settled_drained={TOK: 26_000.0})
    assert s.unsettled_reprobe == {}
    assert s.last_429_level[TOK] == pytest.approx(26_000.0 / (1 - CFG.probe_margin))
    assert s.level_memory_s[TOK] == CFG.memory_s
    s, _ = clean_until(s, t + 15.0, t + 15.0 + 600.0)
    # growth goes on past where the old level held it (here to 1.5x the seed the two cuts
    # re-based), never past the rate the provider served
    assert OLD * (1 - CFG.probe_margin) * 1.1 < s.budgets.tokens_per_s <= 26_000.0


def test_without_the_settlement_growth_stays_under_the_old_level() -> None:
    s, t = reprobed(20_500.0)
    s, _ = clean_until(s, t, t + 600.0)
    assert s.budgets.tokens_per_s == pytest.approx(OLD * (1 - CFG.probe_margin))


def test_a_settled_rate_that_confirms_the_old_level_changes_nothing_but_the_wait() -> None:
    s, t = reprobed(20_500.0)
    settled, _ = window(s, t + 15.0, settled_drained={TOK: 20_800.0})
    assert settled.unsettled_reprobe == {}
    assert settled.last_429_level == s.last_429_level
    assert settled.level_memory_s == s.level_memory_s


def test_the_level_settled_is_at_most_the_level_the_reprobe_drew_its_429_at() -> None:
    s, t = reprobed(20_500.0)
    s, _ = window(s, t + 15.0, settled_drained={TOK: 2 * REPROBE})
    assert s.last_429_level[TOK] == REPROBE


def test_an_unsettled_reprobe_is_dropped_when_no_settlement_comes_in_time() -> None:
    s, t = reprobed(20_500.0)
    s, _ = window(s, t + SETTLE_WITHIN_S)
    assert TOK in s.unsettled_reprobe
    s, _ = window(s, t + SETTLE_WITHIN_S + 15.0)
    assert s.unsettled_reprobe == {}
    late, _ = window(s, t + SETTLE_WITHIN_S + 30.0, settled_drained={TOK: 26_000.0})
    assert late.last_429_level[TOK] == OLD


def test_only_a_reprobe_that_kept_the_old_level_waits() -> None:
    # a first 429, and a re-probe the tick already read as a rise, settle nothing later
    first, _ = window(fresh(), 15.0, LimitType.TOKENS, drained={TOK: 20_000.0})
    assert first.unsettled_reprobe == {}
    risen, _ = reprobed(26_000.0)
    assert risen.last_429_level[TOK] == pytest.approx(26_000.0 / (1 - CFG.probe_margin))
    assert risen.unsettled_reprobe == {}
    # nor one whose tick read no drained rate (a 429 that named its limit with headers on)
    s = replace(fresh(), budgets=replace(SEED, tokens_per_s=OLD))
    s, _ = window(s, 15.0, LimitType.TOKENS)
    s, t = clean_until(s, 15.0, 15.0 + CFG.memory_s + 45.0)
    s = replace(s, budgets=replace(s.budgets, tokens_per_s=REPROBE))
    s, _ = window(s, t + 15.0, LimitType.TOKENS)
    assert s.last_429_level[TOK] == OLD and s.unsettled_reprobe == {}


def test_a_reprobe_whose_429_memory_is_dropped_no_longer_waits() -> None:
    # a recount or an operator's re-base drops the class's 429 level: the re-probe that kept
    # it has nothing left to settle
    s, _ = reprobed(20_500.0)
    assert TOK in s.unsettled_reprobe
    dropped = s.keeping_429_memory(lambda cls: cls != TOK)
    assert dropped.unsettled_reprobe == {} and TOK not in dropped.last_429_level
