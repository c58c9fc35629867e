"""A batch of benchmark results summed up: where the planner meets every target and where not.

Each tuning round of docs/bench-planner.md reads a fresh batch (``evalfleet bench planner
--random N --wide M --json``) the same way: how many scenarios meet every target, how many of
those whose provider sends no rate-limit headers (the planner finds the limits by probing
there), how many per limit that binds, the highest rate_429, the instances stretched past
their timeout, and what each miss misses. This module owns that summary, judged by the
benchmark's own rule (``sim.targets.violations``), so a round's figures are one command
(``evalfleet bench tally``), not a script rewritten each time.

The ``--json`` lines do not say what a scenario's provider reveals; ``headers_by_name`` finds
it from the name, for the generated scenarios (``random-N``, ``wide-N``, drawn again from their
seed) and the shipped files (``NAME`` or ``NAME@SEED`` under ``scenarios/``). ``tally`` itself
is pure: results and a header lookup in, a summary out.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sim.targets import violations

__all__ = ["UNKNOWN", "Group", "Miss", "Tally", "headers_by_name", "tally"]

PLANNER = "planner"
#: the group of a scenario whose header style or binding limit is not known
UNKNOWN = "unknown"
_GENERATED = re.compile(r"^(random|wide)-(\d+)$")


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
    headers_of: Callable[[str], str | None],
) -> Tally:
    """Sum up ``results`` (by scenario, as ``sim.compare.read_results`` reads them), each
    scenario's header style from ``headers_of`` (None: ``UNKNOWN``). Groups and misses are in
    name order."""
    by_headers: dict[str, list[int]] = {}
    by_binding: dict[str, list[int]] = {}
    by_both: dict[str, list[int]] = {}
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
        headers = headers_of(name) or UNKNOWN
        binding = ours.get("binding_limit") or UNKNOWN
        judged += 1
        met += not missed
        for key, groups in (
            (headers, by_headers),
            (binding, by_binding),
            (f"{headers}, {binding}", by_both),
        ):
            counts = groups.setdefault(key, [0, 0])
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
    return Tally(
        judged=judged,
        met=met,
        by_headers={k: Group(*by_headers[k]) for k in sorted(by_headers)},
        by_binding_limit={k: Group(*by_binding[k]) for k in sorted(by_binding)},
        by_headers_and_binding={k: Group(*by_both[k]) for k in sorted(by_both)},
        highest_rate_429=highest,
        highest_rate_429_scenario=highest_at,
        timeouts=timeouts,
        runs_with_timeouts=runs_with_timeouts,
        misses=tuple(misses),
        not_judged=tuple(not_judged),
        without_baselines=tuple(without_baselines),
    )


def headers_by_name(scenario_dir: Path) -> Callable[[str], str | None]:
    """A lookup of a scenario's header style (``anthropic``, ``openai`` or ``none``) by its
    name in ``bench planner`` output: ``random-N`` and ``wide-N`` are drawn again from their
    seed; ``NAME`` and ``NAME@SEED`` are ``scenario_dir/NAME.yaml`` (a seed changes the
    instances, not the provider). None for a name neither explains, or a file that does not
    load (the tally groups it as ``UNKNOWN``; it is still judged)."""
    from evalfleet.errors import ConfigError
    from sim.generate import random_scenario
    from sim.generate_wide import wide_scenario
    from sim.scenario import load_scenario

    def lookup(name: str) -> str | None:
        generated = _GENERATED.match(name)
        if generated:
            kind, seed = generated.group(1), int(generated.group(2))
            drawn = random_scenario(seed) if kind == "random" else wide_scenario(seed)
            return drawn.provider.headers
        path = scenario_dir / f"{name.split('@', 1)[0]}.yaml"
        if not path.is_file():
            return None
        try:
            return load_scenario(path).provider.headers
        except ConfigError:
            return None

    return lookup
