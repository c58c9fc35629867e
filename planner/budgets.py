"""The budget controller: an alias's pacer budgets as a pure function of state, observations, time.

It owns how budgets start (seeded from the alias config or from rate-limit headers), grow
(+5% per clean window up to 1.5x the seed, never back above a level that drew a 429 recently,
never above a limit a header states), get cut (only the budget whose limit was hit), follow a
provider limit down (repeated cuts below the seed re-base the seed), and what spend, overload and
stale-config signals do (pause the run, back off, re-seed from headers). The planner calls
``step`` once per tick with what the gateway saw in that window; ``Budgets`` then go to the
pacer. Units: calls/s, tokens/s (the alias's counted input or combined class), output tokens/s,
and in-flight tokens (a level, not a rate).

Rules, in the order ``step`` applies them:
1. Header limits (per minute, as stated) are hard caps: a budget is never above one; a seed
   above one comes down to it; a stated output limit gets a budget even when the alias config
   has none (it is a limit class the provider has); headers win over config (the seed becomes the header limit,
   ``seed_source="headers"``, ``seeded_at=now``). A limit stated for the first time (or changed)
   takes the budget up to it at once, not +5% per window from a low or stale seed — except
   above ``(1 - probe_margin)`` x a level that drew a 429 within ``memory_s`` (a level at or
   above the stated limit holds growth at that limit: ``BudgetState.level_cap``); a limit stated
   higher than before (by any header or 429 message: ``last_stated``) drops the class's 429
   memory (drawn under the old limit), and one stated lower drops the cuts below the old seed
   and the memory its re-probes doubled (they were the old limit's). A limit not
   stated again within ``stated_cap_memory_s`` is no longer a hard cap (one a 429's message
   stated, never restated by success headers, would cap the budget for good, past a raise).
2. Stale seed (``now - seeded_at > stale_after_s``): re-seed from the latest header limits seen
   within ``stale_after_s`` when there are any; otherwise keep the values and report ``stale``.
   A stale seed nothing re-seeded (nor measured since: a recount to a measured limit,
   ``BudgetState.class_seeded_at``, renews its class) is a guess either way: growth may take
   a budget to ``stale_max_over_seed`` x it (3x, not 1.5x: rule 6), and a 429 above it cuts by ``cut``
   from the level reached, not down to the seed (rule 4's ``cut_to_seed``). Budgets are never
   0: every budget is floored at ``min_fraction`` of its seed (> 0).
3. Spend/billing errors → ``pause_run``. Overload (529/503) and a per-day limit's 429
   (``DAILY``: no per-minute budget was what ran out) → ``backoff_until``, no cut.
4. A 429 → launch freeze (``cooldown_until = now + max(cooldown_s, retry-after)``, the
   retry-after bounded by ``max_freeze_s``) and a cut of only the budget of the limit hit
   (requests→REQUESTS; tokens and input_tokens→TOKENS; output_tokens→OUTPUT_TOKENS, or TOKENS
   for a combined alias with no output budget; unknown→every budget), by ``cut``, and at least
   down to the seed when it was above it (``cut_to_seed``: with per-minute provider buckets a
   small overshoot shows up only minutes later, so the room found above the seed was not
   there; not for a stale seed, rule 2). A class is cut at most once
   per ``cooldown_s`` (429s of calls sent before the cut do not cut again). A cut that follows
   an earlier cut of the class within ``2 x cooldown_s`` (the provider kept rejecting through
   a whole cooldown) goes down to ``(1 - probe_margin)`` x what the provider accepted over that
   cooldown (``WindowObservation.delivered``), but not below ``cut**2`` x the level: a provider
   rejecting calls has an empty bucket, so what it accepts is its refill rate, the limit itself
   (less where rejected retries are charged against it too). Without it a limit
   that halved with no headers took three cuts, each a cooldown of 429s. When it accepted
   (about) everything the budget let through, the 429 is a residue of the overshoot that drew
   the last cut (a per-minute provider bucket still in debt): the budget only eases by
   ``probe_margin`` and the level is not remembered as one that drew a 429 (else a
   conservative cut would cap the budget below the limit for ``memory_s``). The level that drew
   the 429 is remembered for ``memory_s`` (15 minutes); where the 429 named no limit, at most
   ``drained_memory_over`` x how fast the class's bucket was drained
   (``WindowObservation.drained``, about the limit at a 429 of the class; not below two cuts
   under the level): a per-minute bucket lets a budget climb far past the limit before it
   empties, and regrown to that level the budget draws the next 429. A re-probe after that
   which draws a 429 at about the same level (at most ``reprobe_same`` x it) confirms the
   limit: the old level
   stays remembered, the cut goes from it (not from the level the per-minute bucket let the
   re-probe reach, which a cut from leaves above the limit) and the class's memory doubles,
   up to ``memory_max_s`` (40 minutes), so a
   steady limit is re-probed ever more rarely while one raised mid-run (no header says so) is
   found within 15 minutes. Not where the 429 stated the class's limit (a header, or the
   message of an OpenAI output-token 429): the cut goes under the stated limit at once, so
   there is no staircase of re-probes to spare, and the memory stays ``memory_s``. Where the
   429 named no limit, how fast the class's bucket was drained
   (``WindowObservation.drained``) tells the two apart better than the level the re-probe
   reached: drained ``reprobe_rise`` x above what the old level allowed, the limit
   rose, and the drained rate is remembered instead; a re-probe that kept the old level is
   judged so again once the calls in flight at it are answered (the rate read at the tick
   missed them: ``WindowObservation.settled_drained``, ``planner.settled_drain``). A 429 of an
   unknown limit draws the blame only on
   the class the provider accepted most of relative to its budget (when what it accepted was
   measured; read as how fast each bucket was drained, ``WindowObservation.drained``, where
   the gateway says): the other classes are cut too, but their levels stay allowed and the cut does
   not count towards a re-base; and as that blame is a guess, the level it leaves caps growth
   for ``unchecked_memory_s`` (5 minutes) until a re-probe at about that level confirms it
   (a wrong guess held a token budget at half its limit for 20 minutes while the 429s were
   the output limit's). Once ``blame_min_samples`` unknown 429s (one per episode)
   have been measured, the blame is only among the classes whose accepted rate held steady
   across them (the binding limit accepts its limit each time; the other classes move with
   the mix of calls and with our cuts), and the 429 memory earlier unknown 429s left on the
   other classes is dropped: without it a wrong blame feeds itself, as the class cut becomes
   the most used relative to its budget. The steadiness overrules the share only where the
   share rule is in that loop, or agrees (``planner.blame.steady_overrides_share``; a seed
   rule 7 re-based up counts there only as far as it was proven, ``earned_seed``), when the
   rates are those over the last cooldown; read as drained rates (``planner.drain``), which
   at a 429 are the limit hit and not a burst, the steadiness also overrules it where the
   class it would blame moved ``blame_overrule_ratio`` x as much as the steadiest
   (``planner.blame.drained_steadiness_overrules``: the share rule, read from the bursts, cut
   an output budget to a fifth of its seed at every 429 of a token limit whose drained rate
   held within 3%, random-1121). Spreads under ``blame_spread_floor`` are noise and count as
   that floor (a fleet's calls/s held steady by an output limit are as steady as the limit).
5. ``rebase_cuts`` cuts below the seed within ``rebase_period_s`` re-base that class's seed to
   the cut level (the provider's limit dropped): growth is then bounded by 1.5x the new seed and
   by ``(1 - probe_margin)`` x the last level that drew a 429, so it is not re-probed every few
   windows. A cut under a limit the 429 stated does not count: the stated limit is the seed.
6. A clean window (no 429 of that class, no freeze or backoff overlapping the window, and,
   when the observation reports it, the budget used at least ``grow_min_utilisation``, by
   default 0, in a window in which the alias sent something) grows a
   budget by ``growth`` up to min(max_over_seed x seed (``stale_max_over_seed`` x a stale
   one), hard cap, recent 429 level x (1 - probe_margin)). The in-flight budget's use is the
   peak held over the window, except where the provider states its limits and the budget
   sized the fleet (``WindowObservation.sized_by_inflight``) while no rate budget was used in
   full: then it counts as used in full (``planner.inflight_use``).
7. A budget held at rule 6's ceiling over its seed by that ceiling alone (no header limit or
   recent 429 level below it), clean and used at least ``rebase_up_min_utilisation`` (a
   window's use with what earlier windows admitted above the whole budget carried over:
   calls larger than a window of it come in lumps, ``budget_moves.carried_use``) for
   ``rebase_up_s``, or until what the provider accepted exceeds what a full per-minute bucket
   (``provider_burst_s``) and the seed's rate could have served since (at the ceiling fully
   used, 120 s; a stale seed waits out the hold), re-bases its seed to its level: the
   provider accepted more than the seed said, so the seed was low (an operator's guess, or a
   limit raised mid-run). Growth then goes on, +5% per window up to 1.5x the new seed (3x
   while stale); the first 429 cuts and is remembered as usual. A slow start: while the alias has drawn no 429 (none within
   ``memory_max_s``), each further re-base up of the class halves its next hold (down to
   ``rebase_up_min_s``) and doubles its growth (up to ``max_growth``), so a seed a sixth of
   the limit is climbed in about 15 minutes instead of 30; the first 429 ends it.
8. A call the provider accepted whole was held by its per-minute bucket: the class's limit is
   at least its tokens / ``provider_burst_s`` (``WindowObservation.largest_accepted``). Where
   that is above a token or output budget with no stated limit (one call larger than a minute
   of the budget: a seed far below one call's size, whose calls the pacer admits in debt and
   repays at the seed's rate), budget and seed are re-based up to it
   (``budget_moves.proven_by_one_call``).

The types (budgets, config, state, observation) live in ``planner.budget_state``; by how much
a class moves (a cut, growth, a re-base) in ``planner.budget_moves``; whom a 429 blames in
``planner.blame``; how header limits seed and cap the budgets (rule 1) in
``planner.budget_headers``.
Pure: the clock is ``obs.now``; no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from planner import budget_moves
from planner.blame import (
    NOT_RATE_LIMITS,
    blamed_classes,
    classes_hit,
    drained_steadiness_overrules,
    forget_others,
    named_classes,
    pressed_classes,
    steadiest,
    steady_overrides_share,
)
from planner.budget_headers import (
    apply_headers,
    header_budgets,
    header_classes,
    lapse_unstated_caps,
)
from planner.budget_state import (
    NEG_INF,
    BudgetClass,
    Budgets,
    BudgetState,
    ControllerActions,
    ControllerConfig,
    SeedSource,
    TokenClass,
    WindowObservation,
)
from planner.classify import LimitType
from planner.inflight_use import inflight_use
from planner.recount import recounted
from planner.settled_drain import settled

__all__ = [
    "BudgetClass",
    "BudgetState",
    "Budgets",
    "ControllerActions",
    "ControllerConfig",
    "SeedSource",
    "TokenClass",
    "WindowObservation",
    "header_budgets",
    "header_classes",
    "initial_state",
    "rebase",
    "recounted",
    "step",
]


def initial_state(
    seed_config: Budgets,
    now: float,
    *,
    observed_limits: Mapping[LimitType, float] | None = None,
    seeded_at: float | None = None,
    cached_input_counts: bool,
    token_class: TokenClass,
    config: ControllerConfig | None = None,
) -> BudgetState:
    """Seed from the alias config (``seeded_at`` defaults to ``now``); headers win."""
    cfg = config or ControllerConfig()
    state = BudgetState(
        seed=seed_config,
        budgets=seed_config,
        seeded_at=now if seeded_at is None else seeded_at,
        seed_source="config",
        token_class=token_class,
        cached_input_counts=cached_input_counts,
        stale_after_s=cfg.stale_after_s,
    )
    if observed_limits:
        state, _notes = apply_headers(state, observed_limits, now, cfg)
        state = replace(state, answered=True)  # headers come with answers
        budgets = state.budgets
        for cls in state.observed:
            value = state.seed.get(cls)
            assert value is not None
            budgets = budgets.with_value(cls, value)
        state = replace(state, budgets=budgets)
    return state


def rebase(
    state: BudgetState,
    seed: Budgets,
    now: float,
    *,
    budgets: Budgets | None = None,
) -> BudgetState:
    """Operator re-base: new seed and budgets (default: the seed), 429 memory cleared.

    Header hard caps still apply to the budgets.
    """
    new_budgets = budgets or seed
    for cls, cap in state.hard_caps.items():
        v = new_budgets.get(cls)
        if v is not None and v > cap:
            new_budgets = new_budgets.with_value(cls, cap)
    return replace(
        state,
        seed=seed,
        budgets=new_budgets,
        seeded_at=now,
        seed_source="operator",
        share_rebased_at={},  # the share rule's re-bases are of a seed no longer there
        rebase_up_streak={},
        proven_rate={},
    ).keeping_429_memory(lambda _: False)


def step(
    state: BudgetState, obs: WindowObservation, config: ControllerConfig
) -> tuple[BudgetState, ControllerActions]:
    """Advance the controller by one planner window ending at ``obs.now``."""
    now = obs.now
    notes: list[str] = []
    window_start = now - config.window_s
    frozen_in_window = state.cooldown_until > window_start or state.backoff_until > window_start
    state = replace(state, stale_after_s=config.stale_after_s)

    # 1. headers: hard caps, and they win over config; a cap not stated again lapses.
    before_headers = state.budgets
    # the classes whose limit this window's headers or 429 messages state
    stated_now = (
        set(
            header_budgets(
                obs.observed_limits, token_class=state.token_class, has_output_budget=True
            )
        )
        if obs.observed_limits
        else set()
    )
    if obs.observed_limits:
        state, header_notes = apply_headers(state, obs.observed_limits, now, config)
        notes.extend(header_notes)
    state, lapse_notes = lapse_unstated_caps(state, now, config)
    notes.extend(lapse_notes)

    # 2. stale seed.
    reseeded = False
    stale = False
    if state.is_stale(now):
        fresh = (
            state.observed
            if state.observed_at is not None and now - state.observed_at <= config.stale_after_s
            else {}
        )
        if fresh:
            seed, budgets = state.seed, state.budgets
            for cls, cap in fresh.items():
                seed = seed.with_value(cls, cap)
                budgets = budgets.with_value(cls, cap)
            state = replace(
                state,
                seed=seed,
                budgets=budgets,
                seeded_at=now,
                seed_source="headers",
                proven_rate={k: v for k, v in state.proven_rate.items() if k not in fresh},
            )
            reseeded = True
            notes.append("stale seed re-seeded from the latest rate-limit headers")
        else:
            stale = True
            notes.append("seed is stale and no rate-limit headers were seen: keeping its values")

    # 3. spend and overload.
    spend = obs.spend_errors > 0 or any(lt is LimitType.SPEND for lt, _ in obs.throttles)
    overload_after = [ra for lt, ra in obs.throttles if lt is LimitType.OVERLOAD]
    daily_after = [ra for lt, ra in obs.throttles if lt is LimitType.DAILY]
    backoff_until: float | None = None
    if obs.overloads > 0 or overload_after or daily_after:
        wait = max(
            [
                config.overload_backoff_s,
                *(
                    min(r, config.max_freeze_s)
                    for r in (*overload_after, *daily_after)
                    if r is not None
                ),
            ]
        )
        state = replace(state, backoff_until=max(state.backoff_until, now + wait))
        backoff_until = state.backoff_until
        if obs.overloads > 0 or overload_after:
            notes.append(f"provider overloaded: backing off until t={backoff_until:.1f}")
        if daily_after:
            notes.append(
                f"a per-day limit is exhausted: backing off until t={backoff_until:.1f}, "
                "no per-minute budget cut"
            )
    if spend:
        notes.append("spend or billing error: pausing the run")

    # a re-probe judged again on its settled drained rate (planner.settled_drain)
    state, settle_notes = settled(state, obs.settled_drained, now, config)
    notes.extend(settle_notes)

    # 4./5. 429s: freeze, cut only what was hit, re-base on repeated cuts below the seed.
    rate_throttles = [(lt, ra) for lt, ra in obs.throttles if lt not in NOT_RATE_LIMITS]
    hit: set[BudgetClass] = set()
    cut: list[BudgetClass] = []
    rebased: list[BudgetClass] = []
    cooldown_until: float | None = None
    if (obs.answered > 0 or obs.observed_limits) and not state.answered:
        state = replace(state, answered=True)
    if rate_throttles and not state.throttled:
        state = replace(state, throttled=True)
    if rate_throttles:
        longest = max((min(ra, config.max_freeze_s) for _, ra in rate_throttles if ra), default=0.0)
        state = replace(
            state,
            cooldown_until=max(state.cooldown_until, now + max(config.cooldown_s, longest)),
        )
        cooldown_until = state.cooldown_until
        for lt, _ in rate_throttles:
            hit.update(classes_hit(lt, state))
        steady: frozenset[BudgetClass] = frozenset()
        measured = False  # the accepted rates across unknown 429s single out classes
        blame_rates = obs.drained or obs.delivered
        if blame_rates and any(lt is LimitType.UNKNOWN for lt, _ in rate_throttles):
            state, steady = steadiest(state, blame_rates, now, config)
            measured = bool(steady)
            if not (
                obs.drained
                and drained_steadiness_overrules(
                    state, rate_throttles, obs.delivered, steady, config
                )
            ):
                steady = steady_overrides_share(
                    state, rate_throttles, obs.delivered or blame_rates, steady, now, config
                )
            if steady:
                state = forget_others(state, steady, notes)
        pressed = pressed_classes(state, rate_throttles, obs.delivered, steady)
        blamed = blamed_classes(state, rate_throttles, pressed)
        # blamed on the share rule alone: no 429 named the class and no steadiness checked it
        unchecked = set() if measured else blamed - named_classes(state, rate_throttles)
        for cls in (c for c in state.budgets.classes() if c in hit):
            last = state.last_cut_at.get(cls, NEG_INF)
            if now - last < config.cooldown_s:
                continue  # 429s of calls sent before the last cut
            level = state.budgets.get(cls)
            delivered = obs.delivered.get(cls) if obs.delivered and cls in pressed else None
            # a header that came with the 429 may have lowered the budget to a limit it
            # states (the limit dropped): the 429 was drawn at the level before, not at that
            # limit, which caps the budget anyway; remembered as drawn there, it does not hold
            # growth probe_margin under the stated limit for the 429 memory
            state, did_rebase = budget_moves.cut(
                state,
                cls,
                now,
                config,
                delivered,
                blamed=cls in blamed,
                unchecked=cls in unchecked,
                drawn_at=before_headers.get(cls),
                drained=obs.drained.get(cls) if obs.drained else None,
                stated=cls in stated_now,
            )
            cut.append(cls)
            if cls in blamed:
                notes.append(f"{cls}: 429 at {level:.6g} -> cut to {state.budgets.get(cls):.6g}")
            else:
                notes.append(
                    f"{cls}: 429 of an unknown limit, not this one's: cut to "
                    f"{state.budgets.get(cls):.6g}, its level {level:.6g} stays allowed"
                )
            if did_rebase:
                rebased.append(cls)
                notes.append(
                    f"{cls}: repeated cuts below the seed: seed re-based to "
                    f"{state.seed.get(cls):.6g}"
                )

    if rate_throttles and state.rebase_up_streak:
        # rule 7's speed-up lasts while the provider rejects nothing (a slow start): a 429 of
        # any limit says the fleet is near one, whichever class it names
        state = replace(state, rebase_up_streak={})

    # 6. growth on a clean window; 7. a seed the provider clearly allows more than is re-based
    # up.
    grown: list[BudgetClass] = []
    used: dict[BudgetClass, float] = {}  # clean and pressed against: evidence for rule 7
    utilisation = obs.utilisation
    if utilisation is not None:
        utilisation = inflight_use(
            utilisation, obs.sized_by_inflight, limits_stated=state.observed_at is not None
        )
        state, utilisation = budget_moves.carried_use(state, utilisation, config)
    idle = utilisation is not None and not any(v > 0 for v in utilisation.values())
    if not frozen_in_window and not state.in_cooldown(now) and not idle:
        for cls in state.budgets.classes():
            if cls in hit:
                continue
            if (
                obs.utilisation is not None
                and obs.utilisation.get(cls, 0.0) < config.grow_min_utilisation
            ):
                continue
            if (
                utilisation is not None
                and utilisation.get(cls, 0.0) >= config.rebase_up_min_utilisation
            ):
                used[cls] = utilisation[cls]
            new_value = budget_moves.grown(state, cls, now, config)
            if new_value is not None:
                state = replace(state, budgets=state.budgets.with_value(cls, new_value))
                grown.append(cls)
    if obs.utilisation is not None:
        state, rebased_up = budget_moves.rebased_up(state, used, now, config)
        for cls, held_s, proven in rebased_up:
            rebased.append(cls)
            why = "the provider accepted more than the seed allows" if proven else "clean"
            notes.append(
                f"{cls}: held at {budget_moves.over_seed(state, cls, now, config):g}x its seed for "
                f"{held_s:g} s ({why}): seed re-based up to {state.seed.get(cls):.6g}"
            )

    # 8. one call the provider accepted whole proves a limit above a budget far below it.
    if obs.largest_accepted:
        state, lifted = budget_moves.proven_by_one_call(
            state, obs.largest_accepted, config, frozenset(hit)
        )
        for cls, rate in lifted:
            rebased.append(cls)
            notes.append(
                f"{cls}: the provider accepted one call of {obs.largest_accepted[cls]:.6g} "
                f"tokens, more than a minute of the budget: budget re-based up to {rate:.6g}"
            )

    state = _floored(state, config)
    return state, ControllerActions(
        pause_run=spend,
        backoff_until=backoff_until,
        cooldown_until=cooldown_until,
        reseeded=reseeded,
        stale=stale,
        cut=tuple(cut),
        grown=tuple(grown),
        rebased=tuple(rebased),
        notes=tuple(notes),
    )


def _floored(state: BudgetState, config: ControllerConfig) -> BudgetState:
    budgets = state.budgets
    for cls in budgets.classes():
        v = budgets.get(cls)
        s = state.seed.get(cls)
        assert v is not None and s is not None
        floor = s * config.min_fraction
        if v < floor:
            budgets = budgets.with_value(cls, floor)
    return state if budgets is state.budgets else replace(state, budgets=budgets)
