"""How long each instance of a new run is likely to be, from earlier runs of its harness.

A run's launch order (``planner.launch_order``) puts the instances that were shortest before
at the end of its queue. Their size is the median number of LLM calls of the instance's
landed attempts in earlier runs of the same harness: calls, not wall time, because a run
paced hard (or one whose instances waited on a slow provider) stretches every instance's wall
time without making it more work. Attempts that ended in ``error`` count too: one that hit the
instance timeout made at least that many calls, which says it is long. Aborted and lost
attempts do not (they were stopped from outside, not by the instance's own length).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from sqlalchemy import Connection, select

from evalfleet.states import InstanceState
from ledger.models import InstanceResult, Run

__all__ = ["instance_sizes"]

#: the landed states whose call counts measure the instance's own length
_MEASURED = (
    InstanceState.RESOLVED.value,
    InstanceState.UNRESOLVED.value,
    InstanceState.ERROR.value,
)
_CHUNK = 500


def instance_sizes(
    conn: Connection, harness: str, instance_ids: Sequence[str], *, excluding_run: str
) -> dict[str, float]:
    """Per instance of ``instance_ids`` that landed in an earlier run of ``harness`` (any run
    but ``excluding_run``) with calls made, the median of those runs' call counts."""
    calls: dict[str, list[int]] = {}
    ids = list(dict.fromkeys(instance_ids))
    for start in range(0, len(ids), _CHUNK):
        rows = conn.execute(
            select(InstanceResult.instance_id, InstanceResult.calls)
            .join(Run, Run.id == InstanceResult.run_id)
            .where(
                Run.harness == harness,
                Run.id != excluding_run,
                InstanceResult.instance_id.in_(ids[start : start + _CHUNK]),
                InstanceResult.state.in_(_MEASURED),
                InstanceResult.calls > 0,
            )
        ).all()
        for instance_id, count in rows:
            calls.setdefault(instance_id, []).append(int(count))
    return {instance_id: float(statistics.median(counts)) for instance_id, counts in calls.items()}
