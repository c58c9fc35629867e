"""Rule 1 of the budget controller: rate-limit header limits as the seed and as hard caps.

Owns how header values (per minute, by the provider's limit type) map onto the alias's budget
classes, and how a stated limit replaces the seed and caps the budget (``planner.budgets``,
rule 1; the stale re-seed of rule 2 applies the latest headers the same way). Pure: the clock
is an argument; no I/O.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace

from planner.budget_state import BudgetClass, BudgetState, ControllerConfig, TokenClass
from planner.classify import LimitType

__all__ = ["apply_headers", "header_budgets", "header_classes", "lapse_unstated_caps"]


def header_budgets(
    observed_limits: Mapping[LimitType, float],
    *,
    token_class: TokenClass,
    has_output_budget: bool,
) -> dict[BudgetClass, float]:
    """Header limits (per minute) → per-second caps of the budget classes they bind."""
    per_minute = header_classes(
        observed_limits, token_class=token_class, has_output_budget=has_output_budget
    )
    return {cls: v / 60.0 for cls, v in per_minute.items() if v > 0}


def header_classes(
    values: Mapping[LimitType, float],
    *,
    token_class: TokenClass,
    has_output_budget: bool,
) -> dict[BudgetClass, float]:
    """Header values by limit type (limits or remaining, as stated) → by the budget class they
    bind: requests; the alias's counted token class (the combined limit, or input tokens, or
    OpenAI's single token limit for an input alias); output tokens when the alias budgets them."""
    out: dict[BudgetClass, float] = {}

    def take(lt: LimitType, bc: BudgetClass) -> None:
        v = values.get(lt)
        if v is not None and math.isfinite(v) and v >= 0:
            out[bc] = v

    take(LimitType.REQUESTS, BudgetClass.REQUESTS)
    if token_class == "combined":
        take(LimitType.TOKENS, BudgetClass.TOKENS)
    else:
        take(LimitType.INPUT_TOKENS, BudgetClass.TOKENS)
        if BudgetClass.TOKENS not in out:
            # OpenAI-style headers state one token limit; it bounds counted input too
            take(LimitType.TOKENS, BudgetClass.TOKENS)
    if has_output_budget:
        take(LimitType.OUTPUT_TOKENS, BudgetClass.OUTPUT_TOKENS)
    return out


def apply_headers(
    state: BudgetState,
    observed_limits: Mapping[LimitType, float],
    now: float,
    config: ControllerConfig,
) -> tuple[BudgetState, list[str]]:
    """Header limits (per minute) as the alias's seed and hard caps; the notes say what moved."""
    # a stated output limit is a limit class the provider has: it gets a budget even when the
    # alias config has none (else its 429s would cut every other budget, blind)
    caps = header_budgets(observed_limits, token_class=state.token_class, has_output_budget=True)
    if not caps:
        return state, []
    notes: list[str] = []
    # what each class was stated at before, by any header or 429 message (a state saved before
    # ``last_stated`` was kept has only the latest header's)
    before = {
        cls: stated
        for cls in caps
        if (stated := state.last_stated.get(cls, state.observed.get(cls))) is not None
    }
    raised = [
        cls
        for cls, cap in caps.items()
        if cls in before and cap > before[cls] and cls in state.last_429_level
    ]
    if raised:
        # the provider raised a limit it states: a 429 level drawn under the old one says
        # nothing of the new (else the budget waits out the 429 memory, 15 minutes, below a
        # limit the provider has just stated)
        state = state.keeping_429_memory(lambda k: k not in raised)
        notes.extend(f"{cls}: stated limit raised: its 429 memory is dropped" for cls in raised)
    lowered = [cls for cls, cap in caps.items() if cls in before and cap < before[cls]]
    if lowered:
        # the stated limit is the seed now: cuts below the old one say nothing of it (else a
        # 429 that states the lowered limit re-bases the seed to a cut below what it states),
        # and re-probes that confirmed the old limit do not make the new one steady (else its
        # 429 level is held for their doubled memory, and a raise back is found that late)
        state = replace(
            state,
            cuts_below_seed={k: v for k, v in state.cuts_below_seed.items() if k not in lowered},
            level_memory_s={k: v for k, v in state.level_memory_s.items() if k not in lowered},
        )
    seed, budgets = state.seed, state.budgets
    for cls, cap in caps.items():
        previous = seed.get(cls)
        if previous is None:
            notes.append(f"{cls}: a limit the config did not budget: header limit {cap:.6g}/s")
        elif previous != cap:
            notes.append(f"{cls}: seed {previous:.6g} -> header limit {cap:.6g}/s")
        seed = seed.with_value(cls, cap)
        current = budgets.get(cls)
        if current is None or current > cap:
            budgets = budgets.with_value(cls, cap)
        elif state.observed.get(cls) != cap:
            # a newly stated limit: the budget goes to it at once (not +5% per window from a
            # stale or low seed), but not back above a level that drew a 429 recently (unless
            # the limit was raised: that memory was dropped above)
            bound = cap
            remembered = state.level_cap(cls, now, config)
            if remembered is not None:
                bound = min(bound, remembered)
            if bound > current:
                budgets = budgets.with_value(cls, bound)
    hard = {**state.hard_caps, **caps}
    return (
        replace(
            state,
            seed=seed,
            budgets=budgets,
            seeded_at=now,
            seed_source="headers",
            hard_caps=hard,
            cap_stated_at={**state.cap_stated_at, **dict.fromkeys(caps, now)},
            # a stated limit is the seed now: what rule 7 proved of the old one is moot
            proven_rate={k: v for k, v in state.proven_rate.items() if k not in caps},
            observed=dict(caps),
            observed_at=now,
            last_stated={**state.last_stated, **caps},
        ),
        notes,
    )


def lapse_unstated_caps(
    state: BudgetState, now: float, config: ControllerConfig
) -> tuple[BudgetState, list[str]]:
    """Hard caps not stated again within ``stated_cap_memory_s``, nor held by the class's
    429 level memory, stop capping growth.

    Success headers restate their limits with every response, so only a limit a 429's message
    stated (OpenAI's output-token limit) lapses while the alias is busy: growth may then probe
    above it again (rule 6, up to ``max_over_seed`` x the seed it set), and finds a raised
    limit, or draws a 429 that states the limit again and cuts back to it (rule 4). Such a
    re-probe confirms the class's 429 level and doubles its memory up to ``memory_s``, not
    past it (``planner.budget_moves``): an unchanged limit is re-probed after 5, 10, then
    every 15 minutes, one 429 each, and a limit stated otherwise starts again at
    ``stated_cap_memory_s`` (5 minutes), so a raise after a drop is found within that."""
    stale = [
        cls
        for cls, at in state.cap_stated_at.items()
        if cls in state.hard_caps
        and now - at > config.stated_cap_memory_s
        and not state.remembers_429_level(cls, now, config)
    ]
    if not stale:
        return state, []
    notes = [
        f"{cls}: its limit {state.hard_caps[cls]:.6g}/s was not stated again for "
        f"{config.stated_cap_memory_s:g} s: no longer a hard cap"
        for cls in stale
    ]
    return (
        replace(
            state,
            hard_caps={k: v for k, v in state.hard_caps.items() if k not in stale},
            cap_stated_at={k: v for k, v in state.cap_stated_at.items() if k not in stale},
        ),
        notes,
    )
