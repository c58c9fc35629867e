"""How one class's budget moves (rules 4-8 of ``planner.budgets``): a cut after a 429, with
the level it leaves remembered and the re-base down it may make; growth on a clean window up to
its ceiling; the re-base up of a seed the provider clearly allows more than (with a window's
use read with what earlier windows admitted above it carried over); and the lift of a budget
far below one call the provider accepted whole.

``planner.budgets.step`` decides which classes move and why; this module owns by how much.
Pure: the clock is an argument; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from planner.budget_state import NEG_INF, BudgetClass, BudgetState, ControllerConfig

__all__ = ["carried_use", "cut", "grown", "proven_by_one_call", "rebased_up"]


def cut(
    state: BudgetState,
    cls: BudgetClass,
    now: float,
    config: ControllerConfig,
    delivered: float | None = None,
    *,
    blamed: bool = True,
    unchecked: bool = False,
    drawn_at: float | None = None,
    drained: float | None = None,
    stated: bool = False,
) -> tuple[BudgetState, bool]:
    """Cut ``cls`` after a 429 (rule 4). A class the 429 did not blame
    (``planner.blame.blamed_classes``) is cut the same way, but its level is not remembered as
    one that drew a 429 and the cut does not count towards a re-base. A re-base down of an
    ``unchecked`` blame (``planner.budgets.step``) is remembered in ``share_rebased_at``.
    ``drawn_at``: the level the 429 was drawn at when it is not the budget's (a header that
    came with the 429 lowered the budget to the limit it states): that level is remembered.
    ``drained``: how fast the class's provider bucket was drained (``planner.drain``), where
    the 429 named no limit: it tells a re-probe of a raised limit from one of an unchanged
    limit (``_level_memory``). ``stated``: the 429 (or the window's headers) stated the class's
    limit, which ``planner.budget_headers.apply_headers`` made its seed and hard cap: a
    re-probe that finds it again does not double its memory, and the cut under it does not
    count towards a re-base down. Both matter for a limit only a 429's message states
    (OpenAI's output tokens): doubled, the memory held wide-721's budget at the old limit
    for 40 minutes after the provider raised it; counted, two such cuts re-based the seed to
    0.75x the limit the provider had just stated, and growth stalled at 1.5x that."""
    level = state.budgets.get(cls)
    seed_value = state.seed.get(cls)
    assert level is not None and seed_value is not None
    new_value = level * config.cut
    if delivered is not None and delivered > 0:
        previous = state.last_cut_at.get(cls, NEG_INF)
        if now - previous <= 2.0 * config.cooldown_s:
            if delivered >= level * (1.0 - config.probe_margin):
                # it accepted (about) all we sent: this 429 is a residue of the overshoot
                # that drew the last cut (the provider's per-minute bucket still in debt), not
                # a sign the cut level is too high. Ease off a little; the level stays allowed.
                return _eased(state, cls, level, now, config), False
            # rejected through a whole cooldown: what the provider accepted is its limit —
            # but not below two blind cuts: where rejected requests count against the limit
            # (OpenAI), retries can keep the bucket so empty that little is accepted at all
            measured = delivered * (1.0 - config.probe_margin)
            new_value = max(min(new_value, measured), level * config.cut * config.cut)
    drawn = level if drawn_at is None else max(level, drawn_at)
    remembered, memory, kept_old = _level_memory(
        state, cls, drawn, now, config, unchecked=unchecked, drained=drained
    )
    unsettled = {k: v for k, v in state.unsettled_reprobe.items() if k != cls}
    if drained is not None and not stated and kept_old:
        # the drained rate that judged the re-probe missed the calls then in flight: once
        # they are answered, the settled rate may show the limit rose after all
        unsettled[cls] = (now, drawn, remembered)
    if stated:
        memory = _stated_memory(state, cls, memory, now, config)
    if blamed and remembered < level:
        # a re-probe confirmed the old level: the provider's bucket let the budget climb past
        # it before emptying, so the cut starts from the limit, not from the overshoot
        new_value = min(new_value, remembered * config.cut)
    if config.cut_to_seed and level > seed_value and not state.is_stale(now, cls):
        # the room above the seed was not there (a stale seed is no better a guess than the
        # level the provider just rejected: the cut stands)
        new_value = min(new_value, seed_value)
    new_value = max(new_value, seed_value * config.min_fraction)
    if not blamed:
        return (
            replace(
                state,
                budgets=state.budgets.with_value(cls, new_value),
                last_cut_at={**state.last_cut_at, cls: now},
            ),
            False,
        )
    cuts = tuple(t for t in state.cuts_below_seed.get(cls, ()) if now - t <= config.rebase_period_s)
    seed = state.seed
    rebased = False
    if new_value < seed_value and not stated:
        # (a cut under a limit the 429 states is the refill of the provider's bucket, not a
        # sign the limit dropped below the seed: the stated limit is the seed)
        cuts = (*cuts, now)
        if len(cuts) >= config.rebase_cuts:
            seed = seed.with_value(cls, new_value)
            cuts = ()
            rebased = True
    return (
        replace(
            state,
            seed=seed,
            budgets=state.budgets.with_value(cls, new_value),
            seed_source="controller" if rebased else state.seed_source,
            last_429_level={**state.last_429_level, cls: remembered},
            last_429_at={**state.last_429_at, cls: now},
            unsettled_reprobe=unsettled,
            level_memory_s={**state.level_memory_s, cls: memory},
            last_cut_at={**state.last_cut_at, cls: now},
            cuts_below_seed={**state.cuts_below_seed, cls: cuts},
            share_rebased_at={**state.share_rebased_at, cls: now}
            if rebased and unchecked
            else state.share_rebased_at,
        ),
        rebased,
    )


_MAX_STREAK = 16  # past max_growth and rebase_up_min_s more re-bases change nothing


def _recently_cut(state: BudgetState, now: float, config: ControllerConfig) -> bool:
    """A 429 cut some class of the alias within ``memory_max_s``: rule 7's slow start is off."""
    return any(now - t <= config.memory_max_s for t in state.last_cut_at.values())


def _speedup(state: BudgetState, cls: BudgetClass, now: float, config: ControllerConfig) -> float:
    """Rule 7's speed-up of ``cls``: ``rebase_up_speedup`` per re-base up in its run, while
    the alias has had no 429 cut within ``memory_max_s`` (a slow start: it ends at the
    first 429, and starts over from one once that 429 is out of memory)."""
    streak = state.rebase_up_streak.get(cls, 0)
    if streak == 0 or _recently_cut(state, now, config):
        return 1.0
    # bounded so that a long clean run cannot overflow the power
    return float(config.rebase_up_speedup ** min(streak, _MAX_STREAK))


def _stated_memory(
    state: BudgetState, cls: BudgetClass, memory: float, now: float, config: ControllerConfig
) -> float:
    """How long a 429 that states its class's limit is remembered (and the stated cap held
    with it): ``stated_cap_memory_s``, and where a re-probe after the memory lapsed finds the
    limit stated as before (a limit stated otherwise drops the memory:
    ``planner.budget_headers``), twice the last memory, up to ``memory_s``. The re-probes of
    an unchanged limit then come ever more rarely, and the first one after a change comes
    soon: an OpenAI output limit dropped and restored is looked for again 5 minutes after the
    429 that stated the drop (wide-5519, wide-5551: held 15 minutes, the budget stayed at the
    dropped limit after the raise), while re-probing an unchanged one every 5 minutes cut the
    budget to 0.75x it each time (wide-5730, 2.3% slower; wide-5736, 18 429s where `fixed:26`
    drew 38 and 0.1% of the calls is 10). Not doubled further: there is no staircase of
    re-probes to spare (the cut goes under the stated limit at once), and the memory holds
    the budget under a limit the provider may raise without saying so."""
    previous = state.level_memory_s.get(cls)
    if previous is not None and not state.remembers_429_level(cls, now, config):
        return min(2.0 * previous, max(config.memory_s, config.stated_cap_memory_s))
    return min(memory, config.stated_cap_memory_s)


def _level_memory(
    state: BudgetState,
    cls: BudgetClass,
    level: float,
    now: float,
    config: ControllerConfig,
    *,
    unchecked: bool = False,
    drained: float | None = None,
) -> tuple[float, float, bool]:
    """The level a 429 at ``level`` leaves remembered, for how long it caps growth, and
    whether it was a re-probe that kept the old level.

    A 429 while the last level is remembered (or the first) remembers its own level, for the
    class's memory. One after the memory lapsed is a re-probe: at about the same level (at most
    ``reprobe_same`` x it) the limit has not moved, so the old level stays (growth goes back at
    once to what held for the whole memory, not down a staircase of 429s from the higher level
    the per-minute bucket let the re-probe reach; ``cut`` cuts from it too) and the memory
    doubles, up to
    ``memory_max_s``; higher, the limit rose: its level, remembered for ``memory_s``.

    An ``unchecked`` blame (an unknown 429 put on this class by the share rule alone) is a
    guess: a new level it leaves is remembered for ``unchecked_memory_s`` only, so a wrong
    guess holds the class below a limit it never hit for minutes, not for twenty; a re-probe
    that draws a 429 at about the same level confirms it as above.

    Without headers the level a re-probe reaches says little: a full per-minute bucket lets
    it climb up to 1.75x an unchanged limit. How fast the bucket was drained (``drained``, a
    lower bound on the limit, and about the limit at a 429 of its class) says more: where the
    level it would hold the class at (``probe_margin`` under it) is ``reprobe_rise`` x above
    the old level, the provider served more than the old level allowed: the limit rose, and
    what it drained, not the level the bucket let the re-probe reach, is remembered (fresh:
    wide-638, whose request limit rose by a third, was held at the old one for the last hour
    of its run). For the same reason, whatever the branch, the level remembered is at most
    ``drained_memory_over`` x what the bucket drained (but not below two cuts under the
    level, as a guess's drained rate may be far under any limit of its class): a first 429
    remembered at the level the bucket let the budget reach let wide-819's token budget regrow
    to 1.9x its limit, and each regrowth drew another 429. Not tighter: the drained rate
    reads a little low (calls in flight are not in it), and a budget held under it leaves
    the provider's bucket idle: at ``1 / (1 - probe_margin)`` x it, 430 header-less runs
    were 2.9% slower on the mean; at 1.4x, 861 runs were 0.1% slower with 18% fewer 429s,
    and 720 met every target instead of 699 (docs/bench-planner.md, twenty-fifth round)."""
    remembered, memory, kept_old = _remembered(state, cls, level, now, config, unchecked, drained)
    if drained is not None and drained > 0:
        # the bucket drained at about the limit: the level the per-minute bucket let the
        # budget reach before emptying can be far above it, and growth back to that level
        # draws the next 429
        capped = drained * config.drained_memory_over
        remembered = min(remembered, max(capped, level * config.cut * config.cut))
    return remembered, memory, kept_old


def _remembered(
    state: BudgetState,
    cls: BudgetClass,
    level: float,
    now: float,
    config: ControllerConfig,
    unchecked: bool,
    drained: float | None,
) -> tuple[float, float, bool]:
    """``_level_memory`` before the drained rate's cap."""
    fresh = min(config.unchecked_memory_s, config.memory_s) if unchecked else config.memory_s
    previous = state.last_429_level.get(cls)
    memory = state.level_memory_s.get(cls, fresh)
    if previous is None:
        return level, fresh, False
    if state.remembers_429_level(cls, now, config):
        return level, max(memory, fresh), False  # a named 429 lifts a guess's memory to memory_s
    if level <= previous * config.reprobe_same:
        served = None if drained is None else min(level, drained / (1.0 - config.probe_margin))
        if served is not None and served > previous * config.reprobe_rise:
            return served, fresh, False
        return min(level, previous), min(2.0 * memory, config.memory_max_s), level > previous
    return level, fresh, False


def _eased(
    state: BudgetState, cls: BudgetClass, level: float, now: float, config: ControllerConfig
) -> BudgetState:
    """A 429 residue: the budget eases ``probe_margin`` below its level; no new 429 level, no
    re-base count (the level did not draw it)."""
    seed_value = state.seed.get(cls)
    assert seed_value is not None
    value = max(level * (1.0 - config.probe_margin), seed_value * config.min_fraction)
    return replace(
        state,
        budgets=state.budgets.with_value(cls, value),
        last_cut_at={**state.last_cut_at, cls: now},
    )


def over_seed(state: BudgetState, cls: BudgetClass, now: float, config: ControllerConfig) -> float:
    """The class's growth ceiling as a multiple of its seed: ``max_over_seed``, or
    ``stale_max_over_seed`` while its seed is stale (no headers re-seeded it, nothing
    measured it since)."""
    return config.stale_max_over_seed if state.is_stale(now, cls) else config.max_over_seed


def _ceiling(state: BudgetState, cls: BudgetClass, now: float, config: ControllerConfig) -> float:
    """How high growth may take the class: ``over_seed`` x its seed, a header's hard cap,
    and ``probe_margin`` below a 429 level it remembers."""
    seed_value = state.seed.get(cls)
    assert seed_value is not None
    ceiling = seed_value * over_seed(state, cls, now, config)
    if cls in state.hard_caps:
        ceiling = min(ceiling, state.hard_caps[cls])
    remembered = state.level_cap(cls, now, config)
    if remembered is not None:
        ceiling = min(ceiling, remembered)
    return ceiling


def grown(
    state: BudgetState, cls: BudgetClass, now: float, config: ControllerConfig
) -> float | None:
    """Rule 6: the class's budget after a clean window (``growth`` up to its ceiling), or None
    when it is already there."""
    value = state.budgets.get(cls)
    assert value is not None
    growth = max(
        min(config.growth * _speedup(state, cls, now, config), config.max_growth), config.growth
    )
    target = min(value * (1.0 + growth), _ceiling(state, cls, now, config))
    return target if target > value else None


def rebased_up(
    state: BudgetState,
    used: Mapping[BudgetClass, float],
    now: float,
    config: ControllerConfig,
) -> tuple[BudgetState, list[tuple[BudgetClass, float, bool]]]:
    """Rule 7: a class held at ``max_over_seed`` x its seed by that ceiling alone (not by a
    header limit nor a recent 429 level), clean and used (``used``: the window's share of the
    budget admitted, for the classes used at least ``rebase_up_min_utilisation``), re-bases its
    seed to its level once the hold is over: the provider allows more than the seed said (an
    operator's low guess, a limit raised mid-run) and growth may go on. Without utilisation
    figures nothing is proven (an unused budget at its ceiling says nothing of the provider).

    The hold ends after ``rebase_up_s`` (shortened by the slow start), or as soon as what the
    provider accepted at the ceiling proves the seed is not above its limit: a per-minute
    bucket that was full when the hold began serves at most ``limit x (elapsed +
    provider_burst_s)``, so acceptance beyond ``seed x (elapsed + provider_burst_s)`` without a
    429 puts the limit above the seed (at 1.5x the seed fully used, after 120 s; at 0.8 of it
    used, after 300 s), never before ``rebase_up_min_s``. A stale seed (its ceiling
    ``stale_max_over_seed`` x it) waits out the hold: the proof of it would come within a
    minute at 3x, and says nothing of a level that may be well above the limit (a stale seed
    at 0.35x the limit held at 1.05x it was re-based up, and the climb above drew 429s)."""
    since = dict(state.at_ceiling_since)
    accepted = dict(state.at_ceiling_used_s)
    streaks = dict(state.rebase_up_streak)
    proven_rate = dict(state.proven_rate)
    seed = state.seed
    rebased: list[tuple[BudgetClass, float, bool]] = []
    for cls in state.budgets.classes():
        level = state.budgets.get(cls)
        seed_value = seed.get(cls)
        assert level is not None and seed_value is not None
        top = seed_value * over_seed(state, cls, now, config) * (1.0 - 1e-9)
        held_by_seed = level >= top and _ceiling(state, cls, now, config) >= top
        if cls not in used or not held_by_seed:
            since.pop(cls, None)
            accepted.pop(cls, None)
            continue
        start = since.setdefault(cls, now)
        elapsed = now - start
        # seconds of the level the provider accepted since the hold began (the window that
        # ended as it began is not counted: part of it may have been below the ceiling)
        served = accepted.get(cls, 0.0)
        if elapsed > 0:
            served = min(served + min(max(used[cls], 0.0), 1.0) * config.window_s, elapsed)
        accepted[cls] = served
        hold = max(config.rebase_up_s / _speedup(state, cls, now, config), config.rebase_up_min_s)
        # a stale seed's ceiling is 3x it: a proof of the seed would come within a minute
        # while the level may be anywhere up to 3x the limit, so it waits out the hold
        proven = (
            not state.is_stale(now, cls)
            and elapsed >= config.rebase_up_min_s
            and served * level >= seed_value * (elapsed + config.provider_burst_s)
        )
        if elapsed >= hold or proven:
            seed = seed.with_value(cls, level)
            # what the acceptance proved: a bucket full as the hold began and the limit's rate
            # since served it all; never less than what earlier holds proved
            span = elapsed + config.provider_burst_s
            earned = state.earned_seed(cls)
            assert earned is not None
            proven_rate[cls] = max(served * level / span if span > 0 else 0.0, earned)
            since.pop(cls)
            accepted.pop(cls)
            # re-bases while a cut is remembered do not count: the run starts from one after
            streaks[cls] = 0 if _recently_cut(state, now, config) else streaks.get(cls, 0) + 1
            rebased.append((cls, elapsed, proven and elapsed < hold))
    if not rebased and since == state.at_ceiling_since and accepted == state.at_ceiling_used_s:
        return state, []
    return (
        replace(
            state,
            seed=seed,
            at_ceiling_since=since,
            at_ceiling_used_s=accepted,
            rebase_up_streak=streaks,
            proven_rate=proven_rate,
            seed_source="controller" if rebased else state.seed_source,
        ),
        rebased,
    )


def proven_by_one_call(
    state: BudgetState,
    largest: Mapping[BudgetClass, float],
    config: ControllerConfig,
    skip: frozenset[BudgetClass] = frozenset(),
) -> tuple[BudgetState, list[tuple[BudgetClass, float]]]:
    """Rule 8: a call the provider accepted whole was held by its per-minute bucket, so the
    class's limit is at least that call's tokens / ``provider_burst_s`` (``largest``: per
    token class, the tokens of the largest call the provider accepted in the window, counted
    as the alias counts them). Where that proof is above the class's budget, the budget and
    the seed (when below it) are re-based up to it.

    In steady running the proof stays under the budget: the pacer lets through at most a
    bucket of its budget plus one call's debt, so the proof passes the budget only where one
    call is larger than about a minute of it. That is a seed far below the size of one call
    (an operator's typo, a per-minute figure read per second). The pacer then admits each call
    in debt and repays it at the seed's rate, and the +5% per clean window never catches up
    (a seed of 24 tokens/s for calls of 57,000 tokens took 40 minutes a call). A class whose
    limit a header states is skipped: the stated limit is known. So is a class in ``skip`` (a
    429 of it in this window). Requests are not proven this way (one call proves 1/minute)."""
    seed = state.seed
    budgets = state.budgets
    proven_rate = dict(state.proven_rate)
    moved: list[tuple[BudgetClass, float]] = []
    for cls in (BudgetClass.TOKENS, BudgetClass.OUTPUT_TOKENS):
        level = budgets.get(cls)
        tokens = largest.get(cls)
        if level is None or tokens is None or cls in skip or cls in state.hard_caps:
            continue
        proof = tokens / config.provider_burst_s if config.provider_burst_s > 0 else 0.0
        if not proof > level:
            continue
        seed_value = seed.get(cls)
        assert seed_value is not None
        budgets = budgets.with_value(cls, proof)
        if proof > seed_value:
            # the new seed is what was proven, all of it (``earned_seed``)
            seed = seed.with_value(cls, proof)
            proven_rate[cls] = proof
        moved.append((cls, proof))
    if not moved:
        return state, []
    return (
        replace(
            state,
            seed=seed,
            budgets=budgets,
            proven_rate=proven_rate,
            seed_source="controller",
        ),
        moved,
    )


def carried_use(
    state: BudgetState, utilisation: Mapping[BudgetClass, float], config: ControllerConfig
) -> tuple[BudgetState, dict[BudgetClass, float]]:
    """Each budget's use in the window, with what earlier windows admitted above the whole of
    it carried over (at most ``usage_carry_windows`` windows of it), and the state with the
    new carry. A call larger than a window of its budget is admitted in one window and repays
    its debt in the next ones, which admit nothing: use of 3, 0, 0 is the whole budget, as
    1, 1, 1 is. Read window by window, each idle window restarted rule 7's hold, and a budget
    used in lumps was never re-based up."""
    carry: dict[BudgetClass, float] = {}
    out: dict[BudgetClass, float] = {}
    for cls, util in utilisation.items():
        total = max(util, 0.0) + state.usage_carry.get(cls, 0.0)
        out[cls] = min(total, 1.0)
        left = min(total - 1.0, config.usage_carry_windows)
        if left > 0:
            carry[cls] = left
    if carry == state.usage_carry:
        return state, out
    return replace(state, usage_carry=carry), out
