"""Where a batch of planner runs lost their time: one row per traced run, and the batch's tally.

``evalfleet bench trace --count N`` traces N generated scenarios (``sim.trace``) and prints,
per run, what ``bench trace`` prints above its ticks: the seconds of the binding limit the
queued phase and the tail left unused, and the instance the run ended on (how many run longer,
when it was launched against when the queue emptied, its launch plus its unthrottled duration
over the lower bound, and the seconds the pacer and 429s held it). ``tally`` counts the same
over the batch, the figures each round of tuning used to compute with throwaway scripts.
Judged against full rows of ``bench planner --json`` (the baselines), each row also carries
the targets the planner missed (``sim.targets``).

Pure: rows are built from traces already run.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sim.targets import MAX_RATIO, violations
from sim.trace import PlannerTrace

__all__ = ["NEAR_EMPTY_S", "TOP", "BatchTally", "TraceRow", "tally", "trace_row"]

#: "one of the TOP longest": how near the top of the durations the run's last instance is.
TOP = 5
#: "launched as the queue emptied": at most this many seconds before the first tick with an
#: empty queue (the endgame's last launches, and the last few slots a fleet frees).
NEAR_EMPTY_S = 300.0


@dataclass(frozen=True, slots=True)
class TraceRow:
    """One traced run in short (None where the run stalled or no limit class sets its bound)."""

    scenario: str
    ratio: float | None
    http_429: int
    bound_by: str
    queued_lost_s: float | None
    tail_s: float
    tail_lost_s: float | None
    longer: int | None  # instances that run longer than the last to finish
    launched_before_empty_s: float | None  # when the queue emptied less the last one's launch
    soonest_over_bound: float | None  # its launch plus its unthrottled duration / lower bound
    paced_s: float | None
    throttled_s: float | None
    missed: tuple[str, ...] | None = None  # the targets missed; None: not judged

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def trace_row(
    trace: PlannerTrace, baselines: Mapping[str, Mapping[str, Any]] | None = None
) -> TraceRow:
    """The run in short; with ``baselines`` (the scenario's full rows of ``bench planner
    --json``), judged by the benchmark's rule with the traced planner row in place of theirs."""
    queued, tail = trace.phases()
    result = trace.result
    last = trace.ends_on
    bound = float(result["lower_bound_s"])
    missed = None
    if baselines is not None:
        missed = tuple(violations({**baselines, "planner": result}))
    return TraceRow(
        scenario=trace.scenario,
        ratio=result.get("ratio"),
        http_429=int(result["http_429"]),
        bound_by=trace.bound_by,
        queued_lost_s=queued.lost_s,
        tail_s=tail.end_s - tail.start_s,
        tail_lost_s=tail.lost_s,
        longer=last.longer if last is not None else None,
        launched_before_empty_s=tail.start_s - last.launched_s if last is not None else None,
        soonest_over_bound=last.soonest_s / bound if last is not None and bound > 0 else None,
        paced_s=last.paced_s if last is not None else None,
        throttled_s=last.throttled_s if last is not None else None,
        missed=missed,
    )


@dataclass(frozen=True, slots=True)
class BatchTally:
    """What a batch of rows has in common (see ``tally``)."""

    runs: int
    tail_loses_more: int  # the tail left more of the binding limit unused than the queued phase
    ends_on_longest: int
    ends_on_top: int  # on one of the ``TOP`` longest
    launched_near_empty: int  # within ``NEAR_EMPTY_S`` before the queue emptied
    soonest_over_ratio: int  # its launch plus duration alone puts the run over ``MAX_RATIO``
    median_held_s: float | None  # the pacer's and 429s' seconds on the last instance

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def tally(rows: Sequence[TraceRow]) -> BatchTally:
    """Count the rows' shared causes (stalled runs count in ``runs`` only)."""
    held = [
        r.paced_s + r.throttled_s
        for r in rows
        if r.paced_s is not None and r.throttled_s is not None
    ]
    return BatchTally(
        runs=len(rows),
        tail_loses_more=sum(
            1
            for r in rows
            if r.tail_lost_s is not None
            and r.queued_lost_s is not None
            and r.tail_lost_s > r.queued_lost_s
        ),
        ends_on_longest=sum(1 for r in rows if r.longer == 0),
        ends_on_top=sum(1 for r in rows if r.longer is not None and r.longer < TOP),
        launched_near_empty=sum(
            1
            for r in rows
            if r.launched_before_empty_s is not None and r.launched_before_empty_s <= NEAR_EMPTY_S
        ),
        soonest_over_ratio=sum(
            1 for r in rows if r.soonest_over_bound is not None and r.soonest_over_bound > MAX_RATIO
        ),
        median_held_s=statistics.median(held) if held else None,
    )
