"""The budget controller's data: budget classes, budgets, its tuning constants, its state and
what one planner window observed, and the actions it reports.

Kept apart from the rules (``planner.budgets``) so the persistence layer, the pacer and the
gateway can import the types without the controller; ``planner.budgets`` re-exports them.
Pure: no I/O, no clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import Literal

from evalfleet.errors import ConfigError
from planner.bounds import within as _bounded
from planner.classify import LimitType

__all__ = [
    "NEG_INF",
    "BudgetClass",
    "BudgetState",
    "Budgets",
    "ControllerActions",
    "ControllerConfig",
    "SeedSource",
    "TokenClass",
    "WindowObservation",
]

SeedSource = Literal["config", "headers", "operator", "controller"]
TokenClass = Literal["input", "combined"]


class BudgetClass(StrEnum):
    REQUESTS = "requests"
    TOKENS = "tokens"  # the alias's counted input (or combined) token class
    OUTPUT_TOKENS = "output_tokens"
    INFLIGHT = "inflight_tokens"


_FIELD_OF = {
    BudgetClass.REQUESTS: "calls_per_s",
    BudgetClass.TOKENS: "tokens_per_s",
    BudgetClass.OUTPUT_TOKENS: "output_tokens_per_s",
    BudgetClass.INFLIGHT: "inflight_tokens",
}


@dataclass(frozen=True)
class Budgets:
    """Pacer budgets: rates per second, and in-flight tokens (a level)."""

    calls_per_s: float
    tokens_per_s: float
    output_tokens_per_s: float | None
    inflight_tokens: float

    def __post_init__(self) -> None:
        problems = []
        for f in fields(self):
            v = getattr(self, f.name)
            if v is None and f.name == "output_tokens_per_s":
                continue
            if not isinstance(v, int | float) or not math.isfinite(v) or v <= 0:
                problems.append(f"{f.name}: must be a positive finite number, got {v!r}")
        if problems:
            raise ConfigError("budgets", problems)

    def get(self, cls: BudgetClass) -> float | None:
        value: float | None = getattr(self, _FIELD_OF[cls])
        return value

    def with_value(self, cls: BudgetClass, value: float) -> Budgets:
        return replace(self, **{_FIELD_OF[cls]: value})

    def classes(self) -> tuple[BudgetClass, ...]:
        """The classes this alias budgets (output tokens only when configured)."""
        return tuple(c for c in BudgetClass if self.get(c) is not None)


@dataclass(frozen=True)
class ControllerConfig:
    """Controller constants; each default is bounded (``ConfigError`` names the field)."""

    window_s: float = 15.0  # one planner tick [1, 300]
    growth: float = 0.05  # per clean window (0, 0.5]
    max_over_seed: float = 1.5  # growth ceiling, multiple of the seed [1, 4]
    # the same for a stale seed nothing has confirmed (no headers re-seeded it) [max_over_seed,
    # 10]: an old guess may be far off either way, and a 429 cuts it as any other
    stale_max_over_seed: float = 3.0
    cut: float = 0.75  # budget multiplier on a 429 [0.1, 0.95]
    cooldown_s: float = 30.0  # launch freeze after a 429; one cut per class per cooldown [0, 600]
    max_freeze_s: float = 300.0  # bound on a freeze stretched by retry-after [0, 3600]
    # how long a level that drew a 429 caps growth [0, 86400]. A re-probe after that which
    # draws a 429 at about the same level (at most reprobe_same x it) [1, 4] confirms it: the
    # old level is kept and the class's memory doubles, up to memory_max_s [memory_s, 86400].
    # A steady limit is re-probed ever more rarely, a raised one (no header says so) is found
    # within memory_s. "About the same" is wide: growing 5% per window, a re-probe of an
    # unchanged limit climbs on while the provider's full per-minute bucket drains, up to
    # about 1.75x at full demand (the excess over the limit, summed over the windows, reaches
    # the bucket's 60 s at the 11th-12th window: 1.05^11.5). Unchanged limits drew their
    # re-probe 429s at 1.27x-1.75x (random-401, random-413, random-515), which 1.2 took for
    # raised limits, each the start of a staircase of 429s. 15 minutes, not 20: without
    # headers a limit raised mid-run is found only by a re-probe, and most of the header-less
    # runs that missed a target had one (8 of 12 in the seventh batch); at 900 s the header-less
    # rows of batches five to seven run 0.35% faster on the mean with 4% more 429s (600 s: the
    # same speed, 9% more 429s; docs/bench-planner.md, thirty-seventh round)
    memory_s: float = 900.0
    # 40 minutes, not 80 (thirty-seventh round): a limit raised late in a long header-less run
    # was found up to 80 minutes after; header-less rows of batches five to seven 0.17% faster
    # on the mean, 4% more 429s, batch seven 154 -> 156 of 168. Also the span over which unknown
    # 429s' samples, share re-bases and rule 7's slow start look back (they moved with it)
    memory_max_s: float = 2400.0
    # how long a stated limit stays a hard cap without being stated again [60, 86400]. Success
    # headers restate theirs on every response; a limit stated only by a 429's message (OpenAI
    # names an output-token limit there, never in its headers) would otherwise cap the budget
    # for the rest of the run, after the provider raised it too (wide-64 of sim.generate_wide:
    # an output limit doubled an hour in, the budget held at the old one for seven hours). A
    # 429 that states its limit is remembered as long (budget_moves.cut), so both lapse
    # together; each re-probe that finds the limit stated as before doubles that memory, up
    # to memory_s. 5 minutes, not 15 (sixtieth round, docs/bench-planner.md): an output limit
    # dropped and restored held at the dropped one for up to 15 minutes after the raise
    # (wide-5519, ratio 1.307; -5551); without the doubling, re-probes of an unchanged limit
    # every 5 minutes cost two runs of batch 46 (wide-5730, -5736)
    stated_cap_memory_s: float = 300.0
    reprobe_same: float = 1.8
    # a re-probe whose drained rate (planner.drain, read where a 429 names no limit) would hold
    # the class this much above its old level found a raised limit [1, 4] (budget_moves)
    reprobe_rise: float = 1.1
    # a 429 that names no limit is remembered at most this many times the rate its class's
    # bucket drained at (planner.drain: about the limit at the class's 429), and not below two
    # cuts under its level [1, 4] (budget_moves)
    drained_memory_over: float = 1.4
    # how long a level blamed on an unknown 429 by the share rule alone caps growth, until a
    # re-probe confirms it (at most memory_s) [0, 86400]; 10 minutes until the thirty-second
    # round (docs/bench-planner.md): a wrong guess held the other limit idle for that long
    unchecked_memory_s: float = 300.0
    # growth stays this far below a recent 429 level [0, 0.5]; one drawn at or above a limit
    # the provider states holds growth at that limit instead (level_cap)
    probe_margin: float = 0.05
    rebase_cuts: int = 2  # cuts below the seed ... [1, 20]
    rebase_period_s: float = 1800.0  # ... within this period re-base the seed [0, 86400]
    # clean and used at 1.5x the seed this long: re-base up [60, 86400] (sooner when the
    # acceptance proves the seed, see provider_burst_s)
    rebase_up_s: float = 300.0
    # a slow start: each re-base up of a class in a run of them with no 429 in between, and
    # none cut by a 429 within memory_max_s, divides the class's next hold by this and
    # multiplies its growth by it [1, 4] (1: off); the hold down to rebase_up_min_s
    # [60, rebase_up_s], the growth up to max_growth [growth, 0.5]. A seed far below the limit
    # is then climbed in minutes, not 1.5x per rebase_up_s
    rebase_up_speedup: float = 2.0
    rebase_up_min_s: float = 60.0
    max_growth: float = 0.2
    overload_backoff_s: float = 30.0  # back-off after 529/503 [0, 3600]
    stale_after_s: float = 6 * 3600.0  # seed age after which it is stale [60, 30 days]
    min_fraction: float = 0.01  # floor of any budget, as a share of its seed (0, 1]
    # growth needs this share of the budget used [0, 1]. 0: every clean budget grows, used or
    # not, which keeps an unknown 429's blame (the class used most relative to its budget) on
    # the class that binds: budgets held near their use by this gate all look pressed.
    grow_min_utilisation: float = 0.0
    rebase_up_min_utilisation: float = 0.8  # a re-base up needs this share used [0, 1]
    # the provider's bucket depth in seconds of its limit (per-minute limits: 60) [0, 3600]:
    # acceptance beyond what a full bucket could serve proves a seed (rule 7), and one call
    # accepted whole proves a limit of at least its tokens / this (rule 8)
    provider_burst_s: float = 60.0
    # rule 7 reads a window's use of a budget with what earlier windows admitted above the
    # whole of it carried over, at most this many windows of it [0, 100] (0: off)
    usage_carry_windows: float = 8.0
    # an unknown 429's blame: the class whose accepted rate held steadiest over the last
    # blame_samples unknown 429s [0, 50] (0: off), once there are blame_min_samples [2, 50],
    # when its spread is at most blame_spread_ratio x the next class's [0, 1]
    blame_samples: int = 6
    blame_min_samples: int = 3
    blame_spread_ratio: float = 0.7
    # steadiness on drained rates overrules the share rule where the class it would blame
    # moved at least this many times as much as the steadiest [1, 100] (planner.blame; 1:
    # wherever that class is not itself among the steady ones)
    blame_overrule_ratio: float = 1.0
    # spreads of log rates below this are one: noise, not a sign of which class is the limit
    # [0, 0.5] (a limit drained within 0.5% and a fleet's steady calls/s within 1% are tied).
    # 1%, not 3% (fifty-fourth round, docs/bench-planner.md): at 3% an output limit drained
    # within 0.5% tied with calls that moved 2%, and the share rule blamed the requests.
    # Within noise in figures: header-less runs of batches 31-33 and seeds 0-671, 366 of
    # 406 meet every target (363); fresh batch 34's header-less, 47 of 56 (48)
    blame_spread_floor: float = 0.01
    cut_to_seed: bool = True  # a 429 above the seed cuts to the seed at least

    def __post_init__(self) -> None:
        p: list[str] = []
        _bounded("window_s", self.window_s, 1.0, 300.0, p)
        _bounded("growth", self.growth, 1e-6, 0.5, p)
        _bounded("max_over_seed", self.max_over_seed, 1.0, 4.0, p)
        _bounded("stale_max_over_seed", self.stale_max_over_seed, self.max_over_seed, 10.0, p)
        _bounded("cut", self.cut, 0.1, 0.95, p)
        _bounded("cooldown_s", self.cooldown_s, 0.0, 600.0, p)
        _bounded("max_freeze_s", self.max_freeze_s, 0.0, 3600.0, p)
        _bounded("memory_s", self.memory_s, 0.0, 86400.0, p)
        _bounded("memory_max_s", self.memory_max_s, self.memory_s, 86400.0, p)
        _bounded("reprobe_same", self.reprobe_same, 1.0, 4.0, p)
        _bounded("reprobe_rise", self.reprobe_rise, 1.0, 4.0, p)
        _bounded("drained_memory_over", self.drained_memory_over, 1.0, 4.0, p)
        _bounded("stated_cap_memory_s", self.stated_cap_memory_s, 60.0, 86400.0, p)
        _bounded("unchecked_memory_s", self.unchecked_memory_s, 0.0, 86400.0, p)
        _bounded("probe_margin", self.probe_margin, 0.0, 0.5, p)
        _bounded("rebase_cuts", self.rebase_cuts, 1, 20, p)
        _bounded("rebase_period_s", self.rebase_period_s, 0.0, 86400.0, p)
        _bounded("rebase_up_s", self.rebase_up_s, 60.0, 86400.0, p)
        _bounded("rebase_up_speedup", self.rebase_up_speedup, 1.0, 4.0, p)
        _bounded("rebase_up_min_s", self.rebase_up_min_s, 60.0, self.rebase_up_s, p)
        _bounded("max_growth", self.max_growth, self.growth, 0.5, p)
        _bounded("overload_backoff_s", self.overload_backoff_s, 0.0, 3600.0, p)
        _bounded("stale_after_s", self.stale_after_s, 60.0, 30 * 86400.0, p)
        _bounded("min_fraction", self.min_fraction, 1e-6, 1.0, p)
        _bounded("grow_min_utilisation", self.grow_min_utilisation, 0.0, 1.0, p)
        _bounded("rebase_up_min_utilisation", self.rebase_up_min_utilisation, 0.0, 1.0, p)
        _bounded("provider_burst_s", self.provider_burst_s, 0.0, 3600.0, p)
        _bounded("usage_carry_windows", self.usage_carry_windows, 0.0, 100.0, p)
        _bounded("blame_samples", self.blame_samples, 0, 50, p)
        _bounded("blame_min_samples", self.blame_min_samples, 2, 50, p)
        _bounded("blame_spread_ratio", self.blame_spread_ratio, 0.0, 1.0, p)
        _bounded("blame_overrule_ratio", self.blame_overrule_ratio, 1.0, 100.0, p)
        _bounded("blame_spread_floor", self.blame_spread_floor, 0.0, 0.5, p)
        if p:
            raise ConfigError("controller config", p)


NEG_INF = -math.inf


@dataclass(frozen=True)
class BudgetState:
    """Everything the controller remembers about one alias. All budgets are > 0."""

    seed: Budgets
    budgets: Budgets
    seeded_at: float
    seed_source: SeedSource
    token_class: TokenClass
    cached_input_counts: bool
    stale_after_s: float = 6 * 3600.0
    cooldown_until: float = NEG_INF
    backoff_until: float = NEG_INF
    hard_caps: Mapping[BudgetClass, float] = field(default_factory=dict)  # per second
    # when each hard cap was last stated (``ControllerConfig.stated_cap_memory_s``); a cap
    # without one (a state saved before it was kept) does not lapse
    cap_stated_at: Mapping[BudgetClass, float] = field(default_factory=dict)
    last_429_level: Mapping[BudgetClass, float] = field(default_factory=dict)
    last_429_at: Mapping[BudgetClass, float] = field(default_factory=dict)
    # how long each class's last 429 level caps growth, where it is not config.memory_s
    level_memory_s: Mapping[BudgetClass, float] = field(default_factory=dict)
    last_cut_at: Mapping[BudgetClass, float] = field(default_factory=dict)
    cuts_below_seed: Mapping[BudgetClass, tuple[float, ...]] = field(default_factory=dict)
    observed: Mapping[BudgetClass, float] = field(default_factory=dict)  # header limits /s
    observed_at: float | None = None
    # the limit each class was last stated at (/s), by whichever header or 429 message stated
    # it: ``observed`` holds only the latest header's classes, and OpenAI states its output
    # limit only in a 429's message, so the next success forgets it there
    last_stated: Mapping[BudgetClass, float] = field(default_factory=dict)
    # since when each class has stood clean and used at max_over_seed x its seed (rule 7)
    at_ceiling_since: Mapping[BudgetClass, float] = field(default_factory=dict)
    # seconds of its level the provider accepted since then (rule 7's proof of the seed)
    at_ceiling_used_s: Mapping[BudgetClass, float] = field(default_factory=dict)
    # per class, the share of its budget a window admitted above the whole of it, not yet
    # counted (rule 7 reads a window's use with it: a call larger than a window of the budget
    # is admitted in one window and its budget is used in the next ones)
    usage_carry: Mapping[BudgetClass, float] = field(default_factory=dict)
    # how many re-bases up each class has made since the alias's last 429 (rule 7's speed-up)
    rebase_up_streak: Mapping[BudgetClass, int] = field(default_factory=dict)
    # per class whose seed rule 7 re-based up: the rate the provider's acceptance proved then
    # (what it accepted over the hold, less a full per-minute bucket); the seed is the level
    # held, which nothing proved (``earned_seed``). Dropped where a seed that is no guess
    # replaces it: a header limit (stated, or re-applied by a stale re-seed), an operator's
    # re-base, a recount in other units; a re-base down keeps it (``earned_seed`` takes the
    # lower of the two)
    proven_rate: Mapping[BudgetClass, float] = field(default_factory=dict)
    # (when, rate per class) the provider accepted at the latest 429s of an unknown limit
    # (rule 4: the limit hit is the class whose accepted rate holds steady across them)
    unknown_samples: tuple[tuple[float, Mapping[BudgetClass, float]], ...] = ()
    # when each class's seed was last re-based down (rule 5) on unknown 429s blamed by the
    # share of its budget used alone (no steadiness measured yet: ``planner.blame``)
    share_rebased_at: Mapping[BudgetClass, float] = field(default_factory=dict)
    # when each class's seed was last measured from the provider (a recount to the limit its
    # drained rates or a header state in the new units, ``planner.recount``): that seed is no
    # guess, so it is not stale for ``stale_after_s`` after, though the rest of the
    # operator's config may be. Rule 5's and rule 7's re-bases do not renew it: measured,
    # that met the targets on at most one more held-out run and slowed them (a limit raised
    # mid-run is found by a stale seed's 3x climb; docs/bench-planner.md, thirtieth round)
    class_seeded_at: Mapping[BudgetClass, float] = field(default_factory=dict)
    # the provider has answered the alias (a response, or headers stated before the seed), and
    # it has rejected a call for a rate limit: together they end the launch ramp (``ramping``)
    answered: bool = False
    throttled: bool = False
    # per class, a re-probe's 429 that kept the old level (``budget_moves``): (when, the level
    # it was drawn at, the level kept); the drained rate read then missed the calls in
    # flight, and once they are answered the settled rate may show the limit rose
    # (``planner.settled_drain``)
    unsettled_reprobe: Mapping[BudgetClass, tuple[float, float, float]] = field(
        default_factory=dict
    )

    def ramping(self) -> bool:
        """Whether the fleet is still launched gradually (``planner.sizing.SizingConfig``'s
        launch ramp): no 429 yet, and either no answer yet (every budget is the operator's
        guess) or headers that state some limits but not every budgeted rate class's (those
        classes are still guesses: a seed above its limit would launch a first cohort the
        limit cannot serve, and the first 429 would come only after all of it booted).
        Answers without headers end it: what they say comes only as 429s, and holding every
        header-less run to a ramp until its first 429 would slow the runs whose seeds are
        right."""
        if self.throttled:
            return False
        if not self.answered:
            return True
        if self.observed_at is None:
            return False
        rate_classes = (c for c in self.budgets.classes() if c is not BudgetClass.INFLIGHT)
        return any(c not in self.hard_caps for c in rate_classes)

    def in_cooldown(self, now: float) -> bool:
        """Launches are frozen: after a 429 (cooldown) or an overload (backoff)."""
        return now < self.cooldown_until or now < self.backoff_until

    def is_stale(self, now: float, cls: BudgetClass | None = None) -> bool:
        """The seed is older than ``stale_after_s`` (with ``cls``: that class's seed, which
        a measurement of the provider may have renewed, ``class_seeded_at``)."""
        seeded_at = self.seeded_at
        if cls is not None:
            seeded_at = max(seeded_at, self.class_seeded_at.get(cls, NEG_INF))
        return now - seeded_at > self.stale_after_s

    def class_seed_renewed(self, cls: BudgetClass, now: float) -> Mapping[BudgetClass, float]:
        """``class_seeded_at`` with the class's seed renewed at ``now`` (measured then)."""
        return {**self.class_seeded_at, cls: now}

    def remembers_429_level(self, cls: BudgetClass, now: float, config: ControllerConfig) -> bool:
        """The class's last 429 level still caps its growth at ``now`` (for its own memory,
        or ``config.memory_s`` when it has none yet)."""
        at = self.last_429_at.get(cls)
        return at is not None and now - at <= self.level_memory_s.get(cls, config.memory_s)

    def level_cap(self, cls: BudgetClass, now: float, config: ControllerConfig) -> float | None:
        """How high growth may take the class for its last 429 level (None: no level
        remembered): ``probe_margin`` below it; or, where the level is at or above a limit
        the provider states (the class's hard cap), that limit itself.

        A 429 drawn at or above a stated limit says no more than the statement does: the
        pacer overdrew a bucket it had not been held to (OpenAI states its output limit only
        in a 429's message, so the first such 429 comes to an alias with no output budget,
        unpaced). Held ``probe_margin`` under the stated limit for the 429 memory, the
        budget left 5% of that limit idle (wide-2574: a fixed fleet that stormed the limit
        finished 7% sooner). A level under the stated limit is the pacer's own overdraw, and
        growth stays ``probe_margin`` under it."""
        if not self.remembers_429_level(cls, now, config):
            return None
        level = self.last_429_level[cls]
        stated = self.hard_caps.get(cls)
        if stated is not None and level >= stated:
            return stated
        return level * (1.0 - config.probe_margin)

    def earned_seed(self, cls: BudgetClass) -> float | None:
        """The class's seed as far as the provider proved it: the seed, or where rule 7
        re-based it up to a level it held, the rate that hold proved when lower (None: the
        class has no budget)."""
        seed = self.seed.get(cls)
        proven = self.proven_rate.get(cls)
        if seed is None or proven is None:
            return seed
        return min(seed, proven)

    def keeping_429_memory(self, keep: Callable[[BudgetClass], bool]) -> BudgetState:
        """The state with the 429 levels and re-base counts of classes not kept dropped
        (they were measured in other units, or misattributed), with the re-probes of those
        levels waiting to be settled."""
        return replace(
            self,
            unsettled_reprobe={k: v for k, v in self.unsettled_reprobe.items() if keep(k)},
            last_429_level={k: v for k, v in self.last_429_level.items() if keep(k)},
            last_429_at={k: v for k, v in self.last_429_at.items() if keep(k)},
            level_memory_s={k: v for k, v in self.level_memory_s.items() if keep(k)},
            cuts_below_seed={k: v for k, v in self.cuts_below_seed.items() if keep(k)},
        )


@dataclass(frozen=True)
class WindowObservation:
    """What the gateway saw for one alias in one planner window ending at ``now``.

    ``observed_limits``: the latest rate-limit header limits per class, PER MINUTE as the
    headers state them (``Classification.limits``), or None when no header was seen.
    ``utilisation``: the share of each budget the pacer admitted over the window
    (``PacerCore.take_usage(now).utilisation``); when given, only budgets used at least
    ``grow_min_utilisation`` grow, and only budgets used at least ``rebase_up_min_utilisation``
    count towards a re-base up (a budget nobody presses against proves nothing). None: every
    clean budget grows, and none is re-based up.
    ``answered``: how many of the window's calls the provider answered (successes; the launch
    ramp, ``BudgetState.ramping``, lasts until the first).
    ``delivered``: per class, the rate the provider accepted (successful calls, their counted
    tokens, their output tokens; per second) over the last ``cooldown_s``; read by a
    repeated cut (rule 4). None: cuts are by ``cut`` alone.
    ``drained``: per class, how fast the provider's per-minute bucket was drained
    (``planner.drain``); what the blame of a 429 of an unknown limit reads (``planner.blame``),
    ``delivered`` standing in where it is None: at a 429 it is the limit hit, where the rate
    over the last cooldown is whatever burst a full bucket let through.
    ``largest_accepted``: per token class (counted tokens, output tokens), the tokens of the
    largest single call the provider accepted in the window, counted as the alias counts them
    (rule 8). None: nothing is proven by one call.
    ``settled_drained``: per class with an unsettled re-probe (``BudgetState.unsettled_reprobe``),
    how fast its bucket was drained up to that re-probe's step (``planner.drain``), read once
    every call requested before it was answered (``planner.settled_drain``).
    ``sized_by_inflight``: the previous decision's fleet was sized by the in-flight budget
    (``planner.inflight_use.sized_by_inflight``); where the provider states its limits, the
    window then counts it as used in full (``planner.inflight_use``).
    """

    now: float
    throttles: tuple[tuple[LimitType, float | None], ...] = ()
    overloads: int = 0
    spend_errors: int = 0
    observed_limits: Mapping[LimitType, float] | None = None
    utilisation: Mapping[BudgetClass, float] | None = None
    delivered: Mapping[BudgetClass, float] | None = None
    drained: Mapping[BudgetClass, float] | None = None
    answered: int = 0
    largest_accepted: Mapping[BudgetClass, float] | None = None
    sized_by_inflight: bool = False
    settled_drained: Mapping[BudgetClass, float] | None = None


@dataclass(frozen=True)
class ControllerActions:
    pause_run: bool = False
    backoff_until: float | None = None
    cooldown_until: float | None = None
    reseeded: bool = False
    stale: bool = False
    cut: tuple[BudgetClass, ...] = ()
    grown: tuple[BudgetClass, ...] = ()
    rebased: tuple[BudgetClass, ...] = ()
    notes: tuple[str, ...] = ()
