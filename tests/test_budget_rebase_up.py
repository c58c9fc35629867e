"""The budget controller's rule 7: a seed the provider clearly allows more than is re-based up,
on clean evidence only."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from planner.budgets import (
    BudgetClass,
    BudgetState,
    ControllerConfig,
    WindowObservation,
    rebase,
    step,
)
from planner.classify import LimitType
from tests.budget_support import CFG, SEED, fresh, window

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
    if case == "header-limit":
        # success headers restate the limit on every response (else its cap lapses)
        kw["observed_limits"] = {LimitType.REQUESTS: 4500.0}
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
