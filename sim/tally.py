"""A batch of benchmark results summed up: where the planner meets every target and where not.

Each tuning round of docs/bench-planner.md reads a fresh batch (``evalfleet bench planner
--random N --wide M --json``) the same way: how many scenarios meet every target, how many of
those whose provider sends no rate-limit headers (the planner finds the limits by probing
there), how many per limit that binds, the highest rate_429, the instances stretched past
their timeout, and what each miss misses. This module owns that summary, judged by the
benchmark's own rule (``sim.targets.violations``), so a round's figures are one command
(``evalfleet bench tally``), not a script rewritten each time.

The ``--json`` lines do not say what a scenario's provider reveals, nor how far the operator's
config is from it; ``traits_by_name`` finds both from the name, for the generated scenarios
(``random-N``, ``wide-N``, drawn again from their seed) and the shipped files (``NAME`` or
``NAME@SEED`` under ``scenarios/``): the header style, whether the operator's cache belief is
the provider's, and each class's seed against the provider's limit at the start. The last two
are where header-less runs miss (docs/bench-planner.md, sixty-first round: a wrong belief met
32 of 66 runs without headers where a right one met 328 of 375), so a round's tally groups by
them too. ``tally`` itself is pure: results and a lookup in, a summary out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.targets import violations

if TYPE_CHECKING:
    from sim.scenario import Scenario

__all__ = [
    "UNKNOWN",
    "Group",
    "Miss",
    "ScenarioTraits",
    "Tally",
    "seed_bucket",
    "tally",
    "traits_by_name",
    "traits_of_scenario",
]

PLANNER = "planner"
#: the group of a scenario whose header style or binding limit is not known
UNKNOWN = "unknown"
_GENERATED = re.compile(r"^(random|wide)-(\d+)$")


@dataclass(frozen=True)
class ScenarioTraits:
    """What a scenario's name says of it beyond its results: its provider's header style;
    whether the operator's ``cached_input_counts`` is the provider's (None: not known); and
    per limit that can bind a run (``requests``, ``tokens``, ``input_tokens``,
    ``output_tokens``), the operator's seed over the provider's limit at the start, per second
    (None: the alias budgets no such class, or the provider has no such limit)."""

    headers: str
    belief_right: bool | None = None
    seed_ratios: Mapping[str, float | None] = field(default_factory=dict)


def seed_bucket(ratio: float | None) -> str:
    """The group of a seed over its limit (where the planner's probing starts from); the
    labels sort in the order of the ratios."""
    if ratio is None:
        return "no seed"
    if ratio < 0.5:
        return "seed 0-0.5x"
    if ratio < 1.0:
        return "seed 0.5-1x"
    if ratio < 1.5:
        return "seed 1-1.5x"
    return "seed 1.5x+"


@dataclass(frozen=True)
class Group:
    """How many scenarios of a group meet every target, of how many judged."""

    met: int
    total: int


@dataclass(frozen=True)
class Miss:
    """A scenario where the planner misses a target: its header style, the limit that binds
    its planner row, and every target missed."""

    scenario: str
    headers: str
    binding_limit: str
    missed: tuple[str, ...]


@dataclass(frozen=True)
class Tally:
    """A batch summed up (see the module docstring)."""

    judged: int
    met: int
    by_headers: Mapping[str, Group]
    by_binding_limit: Mapping[str, Group]
    #: by both, keyed ``"HEADERS, BINDING"``: where the two meet is where misses gather (three
    #: batches of the fifty-eighth round: header-less output-bound runs met 17 of 31)
    by_headers_and_binding: Mapping[str, Group]
    #: keyed ``"HEADERS, belief right"`` (or ``wrong``, ``unknown``): the operator's
    #: ``cached_input_counts`` against the provider's
    by_headers_and_belief: Mapping[str, Group]
    #: keyed ``"HEADERS, BINDING, seed 1.5x+"`` (``seed_bucket``): the seed of the class
    #: whose limit binds the planner's row, over that limit at the start
    by_headers_and_seed: Mapping[str, Group]
    highest_rate_429: float
    highest_rate_429_scenario: str | None
    #: instances run past their scenario's instance timeout though they fit in it unthrottled
    #: (``sim.metrics.instance_stretch``), summed over the planner's rows
    timeouts: int
    runs_with_timeouts: int
    misses: tuple[Miss, ...]
    #: scenarios without a planner row: nothing to judge
    not_judged: tuple[str, ...] = ()
    #: scenarios with a planner row and no baseline's (``bench planner --policy planner``):
    #: judged on the ratio and rate_429 alone, as the targets against baselines have none
    without_baselines: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        def groups(items: Mapping[str, Group]) -> dict[str, dict[str, int]]:
            return {k: {"met": g.met, "total": g.total} for k, g in items.items()}

        return {
            "judged": self.judged,
            "met": self.met,
            "by_headers": groups(self.by_headers),
            "by_binding_limit": groups(self.by_binding_limit),
            "by_headers_and_binding": groups(self.by_headers_and_binding),
            "by_headers_and_belief": groups(self.by_headers_and_belief),
            "by_headers_and_seed": groups(self.by_headers_and_seed),
            "highest_rate_429": self.highest_rate_429,
            "highest_rate_429_scenario": self.highest_rate_429_scenario,
            "timeouts": self.timeouts,
            "runs_with_timeouts": self.runs_with_timeouts,
            "misses": [
                {
                    "scenario": m.scenario,
                    "headers": m.headers,
                    "binding_limit": m.binding_limit,
                    "missed": list(m.missed),
                }
                for m in self.misses
            ],
            "not_judged": list(self.not_judged),
            "without_baselines": list(self.without_baselines),
        }


def tally(
    results: Mapping[str, Mapping[str, Mapping[str, Any]]],
    traits_of: Callable[[str], ScenarioTraits | None],
) -> Tally:
    """Sum up ``results`` (by scenario, as ``sim.compare.read_results`` reads them), each
    scenario's header style, belief and seeds from ``traits_of`` (None: ``UNKNOWN``). Groups
    and misses are in name order."""
    groups: dict[str, dict[str, list[int]]] = {
        k: {} for k in ("headers", "binding", "both", "belief", "seed")
    }
    misses: list[Miss] = []
    not_judged: list[str] = []
    without_baselines: list[str] = []
    met = judged = timeouts = runs_with_timeouts = 0
    highest, highest_at = 0.0, None
    for name in sorted(results):
        rows = results[name]
        ours = rows.get(PLANNER)
        if ours is None:
            not_judged.append(name)
            continue
        missed = tuple(violations(rows))
        if len(rows) == 1:
            without_baselines.append(name)
        traits = traits_of(name)
        headers = traits.headers if traits is not None else UNKNOWN
        binding = ours.get("binding_limit") or UNKNOWN
        judged += 1
        met += not missed
        for group, key in _keys(traits, headers, binding).items():
            counts = groups[group].setdefault(key, [0, 0])
            counts[0] += not missed
            counts[1] += 1
        if missed:
            misses.append(Miss(name, headers, binding, missed))
        rate = ours.get("rate_429") or 0.0
        if rate > highest:
            highest, highest_at = float(rate), name
        stretched = int(ours.get("timeouts") or 0)
        timeouts += stretched
        runs_with_timeouts += stretched > 0

    def summed(group: str) -> dict[str, Group]:
        return {k: Group(*v) for k, v in sorted(groups[group].items())}

    return Tally(
        judged=judged,
        met=met,
        by_headers=summed("headers"),
        by_binding_limit=summed("binding"),
        by_headers_and_binding=summed("both"),
        by_headers_and_belief=summed("belief"),
        by_headers_and_seed=summed("seed"),
        highest_rate_429=highest,
        highest_rate_429_scenario=highest_at,
        timeouts=timeouts,
        runs_with_timeouts=runs_with_timeouts,
        misses=tuple(misses),
        not_judged=tuple(not_judged),
        without_baselines=tuple(without_baselines),
    )


def _keys(traits: ScenarioTraits | None, headers: str, binding: str) -> dict[str, str]:
    """The key of a judged scenario in each group."""
    belief = UNKNOWN
    if traits is not None and traits.belief_right is not None:
        belief = "right" if traits.belief_right else "wrong"
    seed = UNKNOWN
    if traits is not None and binding in traits.seed_ratios:
        seed = seed_bucket(traits.seed_ratios[binding])
    return {
        "headers": headers,
        "binding": binding,
        "both": f"{headers}, {binding}",
        "belief": f"{headers}, belief {belief}",
        "seed": f"{headers}, {binding}, {seed}",
    }


def traits_of_scenario(scenario: Scenario) -> ScenarioTraits:
    """A scenario's traits (``ScenarioTraits``): its seeds over its provider's limits at the
    start, in the operator's units (a wrong belief about cache reads makes the token seed's
    number mean other tokens than the limit's)."""
    provider, alias = scenario.provider, scenario.alias_config

    def ratio(seed_per_s: float | None, limit_per_min: int | None) -> float | None:
        if seed_per_s is None or limit_per_min is None:
            return None
        return seed_per_s / (limit_per_min / 60.0)

    return ScenarioTraits(
        headers=provider.headers,
        belief_right=alias.cached_input_counts == provider.cached_input_counts,
        seed_ratios={
            "requests": ratio(alias.calls_per_s, provider.rpm),
            "tokens": ratio(alias.tokens_per_s, provider.tpm),
            "input_tokens": ratio(alias.tokens_per_s, provider.input_tpm),
            "output_tokens": ratio(alias.output_tokens_per_s, provider.output_tpm),
        },
    )


def traits_by_name(scenario_dir: Path) -> Callable[[str], ScenarioTraits | None]:
    """A lookup of a scenario's traits by its name in ``bench planner`` output: ``random-N``
    and ``wide-N`` are drawn again from their seed; ``NAME`` and ``NAME@SEED`` are
    ``scenario_dir/NAME.yaml`` (a seed changes the instances, not the provider or the alias).
    None for a name neither explains, or a file that does not load (the tally groups it as
    ``UNKNOWN``; it is still judged)."""
    from evalfleet.errors import ConfigError
    from sim.generate import random_scenario
    from sim.generate_wide import wide_scenario
    from sim.scenario import load_scenario

    def lookup(name: str) -> ScenarioTraits | None:
        generated = _GENERATED.match(name)
        if generated:
            kind, seed = generated.group(1), int(generated.group(2))
            drawn = random_scenario(seed) if kind == "random" else wide_scenario(seed)
            return traits_of_scenario(drawn)
        path = scenario_dir / f"{name.split('@', 1)[0]}.yaml"
        if not path.is_file():
            return None
        try:
            return traits_of_scenario(load_scenario(path))
        except ConfigError:
            return None

    return lookup
