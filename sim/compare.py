"""A planner change judged against results already run: new planner rows against old full rows.

Each round of the planner's tuning runs the baselines once (``evalfleet bench planner --json``:
every policy) and a changed planner many times (``--policy planner --json`` on the changed
code). The baselines do not depend on the planner, so the changed planner's rows are judged
against the old rows' baselines with the benchmark's own rule (``sim.targets.violations``).
This module owns that comparison: which scenarios meet every target before and after, which
flip, the geometric mean of the makespans (new over old), and the planner's 429s.

Reads ``bench planner --json`` lines (one scenario per line); a line that is not one is a
``ConfigError`` naming the file and the line. Pure apart from reading the files it is given.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from evalfleet.errors import ConfigError
from sim.targets import violations

__all__ = ["Comparison", "Flip", "compare", "read_results"]

PLANNER = "planner"


class _JudgedRow(BaseModel):
    """The columns of a result row that ``sim.targets.violations`` reads (the others pass)."""

    model_config = ConfigDict(extra="allow", strict=True)

    makespan_s: float | None
    ratio: float | None
    calls: int
    http_429: int
    rate_429: float


class _ResultLine(BaseModel):
    """One line of ``bench planner --json``: ``{"scenario": NAME, "results": {POLICY: row}}``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    scenario: str
    results: dict[str, dict[str, Any]]


def read_results(paths: Iterable[Path]) -> dict[str, dict[str, dict[str, Any]]]:
    """The results of every scenario in ``paths`` (``bench planner --json`` output), by name;
    a later file's scenario replaces an earlier one's. ConfigError: a line that is not such an
    object, or a row without a column the targets read."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for path in paths:
        problems: list[str] = []
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(str(path), [f"cannot be read: {exc.strerror or exc}"]) from None
        for number, raw in enumerate(text.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                line = _ResultLine.model_validate(json.loads(raw))
            except json.JSONDecodeError as exc:
                problems.append(f"line {number}: not JSON ({exc.msg})")
                continue
            except ValidationError as exc:
                first = exc.errors()[0]
                where = ".".join(str(p) for p in first["loc"]) or "line"
                problems.append(f"line {number}: {where}: {first['msg']}")
                continue
            for policy, row in line.results.items():
                try:
                    _JudgedRow.model_validate(row)
                except ValidationError as exc:
                    bad = "; ".join(
                        f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()
                    )
                    problems.append(f"line {number}: {line.scenario} {policy}: {bad}")
            out[line.scenario] = line.results
        if problems:
            raise ConfigError(str(path), problems)
    return out


@dataclass(frozen=True)
class Flip:
    """A scenario whose verdict the new planner row changes: the two makespans (None: stalled)
    and what the new row misses (empty when it newly meets every target)."""

    scenario: str
    old_makespan_s: float | None
    new_makespan_s: float | None
    missed: tuple[str, ...]


@dataclass(frozen=True)
class Comparison:
    """New planner rows judged against old full rows (see the module docstring)."""

    compared: int
    met_before: int
    met_after: int
    #: geometric mean of new / old makespan over the scenarios both finished (None: none did)
    mean_makespan_ratio: float | None
    http_429_before: int
    http_429_after: int
    highest_rate_429_after: float
    newly_met: tuple[Flip, ...]
    newly_missed: tuple[Flip, ...]
    #: new scenarios that cannot be judged: not in the old set, or without a planner row
    not_compared: tuple[str, ...] = ()
    #: old scenarios the new set does not run (a subset was run again: expected)
    old_only: int = 0

    def as_json(self) -> dict[str, Any]:
        def flips(items: tuple[Flip, ...]) -> list[dict[str, Any]]:
            return [
                {
                    "scenario": f.scenario,
                    "old_makespan_s": f.old_makespan_s,
                    "new_makespan_s": f.new_makespan_s,
                    "missed": list(f.missed),
                }
                for f in items
            ]

        return {
            "compared": self.compared,
            "met_before": self.met_before,
            "met_after": self.met_after,
            "mean_makespan_ratio": self.mean_makespan_ratio,
            "http_429_before": self.http_429_before,
            "http_429_after": self.http_429_after,
            "highest_rate_429_after": self.highest_rate_429_after,
            "newly_met": flips(self.newly_met),
            "newly_missed": flips(self.newly_missed),
            "not_compared": list(self.not_compared),
            "old_only": self.old_only,
        }


def compare(
    old: Mapping[str, Mapping[str, Mapping[str, Any]]],
    new: Mapping[str, Mapping[str, Mapping[str, Any]]],
) -> Comparison:
    """Judge each scenario's new planner row against the old rows' baselines (the new rows'
    own baselines, if any, are ignored: the baselines do not depend on the planner)."""
    met_before = met_after = 0
    logs: list[float] = []
    before_429 = after_429 = 0
    highest = 0.0
    gained: list[Flip] = []
    lost: list[Flip] = []
    names = [name for name in new if PLANNER in new[name] and PLANNER in old.get(name, {})]
    skipped = sorted(set(new) - set(names))
    for name in names:
        before_rows = old[name]
        after_rows = {**before_rows, PLANNER: new[name][PLANNER]}
        missed_before = violations(before_rows)
        missed_after = violations(after_rows)
        met_before += not missed_before
        met_after += not missed_after
        was, now = before_rows[PLANNER], after_rows[PLANNER]
        before_429 += int(was["http_429"])
        after_429 += int(now["http_429"])
        highest = max(highest, float(now["rate_429"]))
        if was["makespan_s"] and now["makespan_s"]:
            logs.append(math.log(now["makespan_s"] / was["makespan_s"]))
        if bool(missed_before) != bool(missed_after):
            flip = Flip(name, was["makespan_s"], now["makespan_s"], tuple(missed_after))
            (lost if missed_after else gained).append(flip)
    return Comparison(
        compared=len(names),
        met_before=met_before,
        met_after=met_after,
        mean_makespan_ratio=math.exp(sum(logs) / len(logs)) if logs else None,
        http_429_before=before_429,
        http_429_after=after_429,
        highest_rate_429_after=highest,
        newly_met=tuple(gained),
        newly_missed=tuple(lost),
        not_compared=tuple(skipped),
        old_only=sum(1 for name in old if name not in new),
    )
