"""Which limit a 429 hit: the budget classes a 429 names, and the blame for an unknown one.

The budget controller (``planner.budgets``, rule 4) cuts the classes a 429 hits and remembers
the level of the class it blames. A 429 that names its limit (headers, ``error.type``, an
Anthropic message) blames that class. One that does not (``LimitType.UNKNOWN``: providers
without rate-limit headers) cuts every class, and the blame is inferred from what the provider
accepted: at first the class used most relative to its budget, and once a few such 429s have
been measured only among the classes whose accepted rate held steady across them. What it
accepted is read as how fast each per-minute bucket was drained (``planner.drain``), which at
a 429 is the limit hit, where the gateway gives it; else as the rate over the last cooldown.
Pure: the clock is an argument; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import replace

from planner.budget_state import BudgetClass, Budgets, BudgetState, ControllerConfig, TokenClass
from planner.classify import LimitType

__all__ = [
    "NOT_RATE_LIMITS",
    "blamed_classes",
    "classes_hit",
    "classes_of_limit",
    "drained_steadiness_overrules",
    "forget_others",
    "named_classes",
    "pressed_classes",
    "sample_spreads",
    "steadiest",
    "steady_overrides_share",
]


#: 429s that say nothing of a per-minute budget: spend, overload, a per-day limit, none; the
#: controller cuts nothing for them, nor does the pacer's provisional cut
NOT_RATE_LIMITS = frozenset({LimitType.SPEND, LimitType.OVERLOAD, LimitType.DAILY, LimitType.NONE})


def classes_of_limit(
    lt: LimitType, budgets: Budgets, token_class: TokenClass
) -> tuple[BudgetClass, ...]:
    """The budget classes a 429 of limit ``lt`` cuts: the named limit's class (an output
    limit's is the combined token budget where there is no output budget); every class for an
    unknown limit (or an output limit with nothing to cut)."""
    if lt is LimitType.REQUESTS:
        return (BudgetClass.REQUESTS,)
    if lt in (LimitType.TOKENS, LimitType.INPUT_TOKENS):
        return (BudgetClass.TOKENS,)
    if lt is LimitType.OUTPUT_TOKENS:
        if budgets.output_tokens_per_s is not None:
            return (BudgetClass.OUTPUT_TOKENS,)
        if token_class == "combined":
            return (BudgetClass.TOKENS,)
    return budgets.classes()


def classes_hit(lt: LimitType, state: BudgetState) -> tuple[BudgetClass, ...]:
    return classes_of_limit(lt, state.budgets, state.token_class)


def named_classes(
    state: BudgetState, throttles: Sequence[tuple[LimitType, float | None]]
) -> set[BudgetClass]:
    """The classes the 429s that name their limit hit (the unknown ones name none)."""
    return {c for lt, _ in throttles if lt is not LimitType.UNKNOWN for c in classes_hit(lt, state)}


def pressed_classes(
    state: BudgetState,
    throttles: Sequence[tuple[LimitType, float | None]],
    delivered: Mapping[BudgetClass, float] | None,
    steady: frozenset[BudgetClass] = frozenset(),
) -> set[BudgetClass]:
    """The classes whose provider limit the 429s name, where what the provider accepted
    measures that limit. An unknown 429 names none: then the class the provider accepted most
    of, relative to its budget, is taken as the one it limits (the other classes' acceptance
    is what their demand was, not a limit), among the classes the accepted rates across the
    latest unknown 429s single out (``steady``, see ``steadiest``) when they do."""
    if not delivered:
        return set()
    named = named_classes(state, throttles)
    if any(lt is LimitType.UNKNOWN for lt, _ in throttles):
        shares = {
            cls: rate / level
            for cls, rate in delivered.items()
            if (level := state.budgets.get(cls)) is not None
            and level > 0
            and (not steady or cls in steady)
        }
        if shares:
            named.add(max(shares, key=lambda cls: shares[cls]))
    return named


def steadiest(
    state: BudgetState,
    delivered: Mapping[BudgetClass, float],
    now: float,
    config: ControllerConfig,
) -> tuple[BudgetState, frozenset[BudgetClass]]:
    """The classes a 429 of an unknown limit may have hit, when the evidence narrows them
    (else empty); the samples kept.

    A provider rejects when one bucket is empty, and then accepts that class at its limit:
    across its 429s the binding class's accepted rate holds steady while the others move with
    the mix of calls (contexts grow with task age) and with our own cuts. The share of each
    budget used cannot tell: a class blamed and cut becomes the most used relative to its
    budget, so a wrong blame feeds itself (a token limit's 429s cut the output budget to a
    sixth of the provider's output limit). Steady: a spread of log rates over the last
    ``blame_samples`` unknown 429s within ``memory_max_s`` (at least ``blame_spread_floor``:
    below it, noise) at most 1 / ``blame_spread_ratio`` x the smallest (classes tied with the
    steadiest stay in, e.g. output that moves with calls); empty before ``blame_min_samples``,
    or when every class is as steady."""
    if config.blame_samples == 0:
        return state, frozenset()
    rates = {c: v for c, v in delivered.items() if c in state.budgets.classes() and v > 0}
    samples = [(t, r) for t, r in state.unknown_samples if now - t <= config.memory_max_s]
    if not samples or now - samples[-1][0] >= 2.0 * config.cooldown_s:
        # one sample per episode: the 429s that follow within it measure the storm (the
        # provider's bucket in debt, every class held back by our cuts), not the limit
        samples = [*samples, (now, rates)][-config.blame_samples :]
    state = replace(state, unknown_samples=tuple(samples))
    if len(samples) < config.blame_min_samples:
        return state, frozenset()
    spreads = sample_spreads(state, config.blame_spread_floor)
    low = min(spreads.values(), default=0.0)
    steady = frozenset(c for c, v in spreads.items() if v * config.blame_spread_ratio <= low)
    if len(spreads) < 2 or steady == frozenset(spreads):
        return state, frozenset()
    return state, steady


def sample_spreads(state: BudgetState, floor: float = 0.0) -> dict[BudgetClass, float]:
    """Per class, the spread (standard deviation) of the log rates accepted across the kept
    unknown-429 samples (``BudgetState.unknown_samples``), for the classes measured in all;
    at least ``floor`` (``ControllerConfig.blame_spread_floor``: below it, noise)."""
    samples = state.unknown_samples
    spreads: dict[BudgetClass, float] = {}
    if not samples:
        return spreads
    for cls in samples[-1][1]:
        logs = [math.log(r[cls]) for _, r in samples if r.get(cls, 0.0) > 0]
        if len(logs) == len(samples):
            mean = sum(logs) / len(logs)
            spread = math.sqrt(sum((x - mean) ** 2 for x in logs) / len(logs))
            spreads[cls] = max(spread, floor)
    return spreads


def drained_steadiness_overrules(
    state: BudgetState,
    throttles: Sequence[tuple[LimitType, float | None]],
    delivered: Mapping[BudgetClass, float] | None,
    steady: frozenset[BudgetClass],
    config: ControllerConfig,
) -> bool:
    """Whether steadiness measured on drained rates (``planner.drain``) overrules the share
    rule outright: when every class the share rule would blame instead moved across the
    samples by at least ``blame_overrule_ratio`` x the steadiest class's spread. At a 429 the
    drained rate of the class hit is its limit; a class the share rule keeps blaming and
    cutting then drains ever less (random-1121: output 1,033 down to 450 tokens/s across the
    429s of a token limit drained at 69-75k/s, within 3%). A class merely as steady is as
    likely the fleet's steady demand (calls/s of a fleet an output limit holds still:
    random-413), and there the share rule's guard stands (``steady_overrides_share``)."""
    if not steady:
        return False
    share_blamed = pressed_classes(state, throttles, delivered) - steady
    spreads = sample_spreads(state, config.blame_spread_floor)
    low = min((spreads[c] for c in steady if c in spreads), default=None)
    if low is None or not share_blamed:
        return False
    return all(
        c in spreads and spreads[c] >= config.blame_overrule_ratio * low for c in share_blamed
    )


def steady_overrides_share(
    state: BudgetState,
    throttles: Sequence[tuple[LimitType, float | None]],
    delivered: Mapping[BudgetClass, float],
    steady: frozenset[BudgetClass],
    now: float,
    config: ControllerConfig,
) -> frozenset[BudgetClass]:
    """``steady`` when it may narrow the blame of an unknown 429 (and drop the other classes'
    429 memory), else empty: when the class used most relative to its budget (the share
    rule's blame) is one of them, or when the share rule is in the loop it falls into.
    Measured on drained rates (``planner.drain``) it also stands where
    ``drained_steadiness_overrules`` says (``planner.budgets.step``).

    The loop: a class the share rule blamed and cut below its seed is then used most relative
    to its (cut) budget, and is blamed again; two such cuts re-base its seed down before any
    steadiness can be measured, and the loop goes on from the lower seed. So: the class the
    share rule blames is below its seed, or its seed was re-based down within ``memory_max_s`` on
    the share rule alone (``BudgetState.share_rebased_at``). A seed rule 7 re-based up counts
    only as far as the provider's acceptance proved it (``BudgetState.earned_seed``): taken at
    its word, the level it held makes a class pressed at its limit just under it look "below
    its seed", and a class steady only because the fleet's demand is takes the blame.
    Outside the loop the class the share rule blames was pressed at a level at or above a seed
    it has earned, and the others' steadiness is as likely their steady demand (the calls of a
    fleet a token limit holds still) as a limit: there the share rule stands, and the other
    classes' 429 memory is kept (dropping it re-probes a limit already found)."""
    if not steady:
        return steady
    share_blamed = pressed_classes(state, throttles, delivered) - steady
    looping = any(
        (level := state.budgets.get(cls)) is not None
        and (seed := state.earned_seed(cls)) is not None
        and (
            level < seed or now - state.share_rebased_at.get(cls, -math.inf) <= config.memory_max_s
        )
        for cls in share_blamed
    )
    return steady if looping or not share_blamed else frozenset()


def forget_others(
    state: BudgetState, steady: frozenset[BudgetClass], notes: list[str]
) -> BudgetState:
    """Unknown 429s hit one of the ``steady`` classes' limits: the 429 levels and re-base
    counts earlier unknown 429s left on other classes were misattributed, and are dropped."""
    wrong = sorted(c for c in {*state.last_429_level, *state.cuts_below_seed} if c not in steady)
    names = "/".join(sorted(steady))
    for cls in wrong:
        notes.append(
            f"{cls}: unknown 429s hit the {names} limit (its accepted rate held steady where "
            "this one's moved): this class's 429 memory is dropped"
        )
    if not wrong:
        return state
    return state.keeping_429_memory(lambda k: k in steady)


def blamed_classes(
    state: BudgetState,
    throttles: Sequence[tuple[LimitType, float | None]],
    pressed: set[BudgetClass],
) -> set[BudgetClass]:
    """The classes whose level drew the 429s: those a 429 names, and for a 429 of an unknown
    limit the class the provider accepted most of (``pressed``), or every class when nothing
    measured which. An unknown 429 still cuts every class (any of them may be the one), but
    only a blamed class's level is remembered as one that drew a 429 and counts towards a
    re-base: else a token limit's 429s would cap the request budget below its own limit."""
    if not pressed and any(lt is LimitType.UNKNOWN for lt, _ in throttles):
        return set(state.budgets.classes())
    return named_classes(state, throttles) | pressed
