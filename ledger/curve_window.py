"""The refit's input: the ``llm_calls`` of one harness over a time window, as the
``planner.fit.fit_curve`` tables (``load_fit_window``).

Loading: the successful calls (status 200) of one harness whose instances ran *entirely* inside
a time window:

- calls: ``instance_id`` (``run_id/instance_id``), ``t_request_s`` = ``llm_calls.task_age_s``
  (the gateway's task age at request), and the token columns;
- instances: ``instance_id`` and ``wall_time_s`` = ``instance_results.finished_at`` minus the
  task's start, where the start is ``requested_at - task_age_s`` of its calls (the latest
  attempt's: calls of earlier attempts of a requeued instance are left out).

Task ages are on the task's *own* clock by default (``unthrottled``): the time the instance lost
to throttling before a request (its successful calls' time from request to send, and for every
other attempt the time until its next request: pacer wait, back-off, retry-after) is subtracted
from the request's age and from the instance's duration. A curve is the *demand* of a task by
age; fitted from wall-clock ages of a paced run it would show the pacer's throughput instead
(tasks stretched by waiting ask less per second), and a planner sizing on it would over-launch.

Only instances that ended naturally (``resolved``, ``unresolved``, ``error``) count: a running
instance's duration is not known yet, and ``aborted``/``lost`` ones did not end on their own;
both would bias survival. Instances that started before ``since`` or ended after ``until`` are
left out for the same reason (their calls at some ages would be missing). ``FitWindow.dropped``
says how many of each were left out. A call without ``task_age_s`` gets ``requested_at`` minus
its instance's ``running_at`` (the harness's start), or on rows written before that was
recorded its ``started_at`` (the claim time: boot included, so a slight over-estimate).

Kept apart from the stored curves (``ledger.curves``): it is the refit's read of what the
gateway and the queue wrote (``llm_calls``, ``instance_results``), reshaped with pandas for the
fit; only the refit (``analysis.refit``) loads it, while the planner loop reads stored curves.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import numpy as np
import pandas as pd
from sqlalchemy import Engine, and_, or_, select

from evalfleet.errors import ConfigError
from ledger.curves import check_harness
from ledger.db import readonly
from ledger.models import InstanceResult, LlmCall, Run
from planner.fit import CALL_COLUMNS

__all__ = ["ATTEMPT_GAP_S", "NATURAL_ENDS", "FitWindow", "load_fit_window"]

#: Instance states whose ``finished_at`` is a natural end of the task.
NATURAL_ENDS = ("resolved", "unresolved", "error")
#: Calls whose implied task start is this much earlier than the latest one belong to an
#: earlier attempt (clock jitter between requested_at and task_age_s stays far below it).
ATTEMPT_GAP_S = 5.0


@dataclass(frozen=True)
class FitWindow:
    """What ``load_fit_window`` found: the fit tables and what was left out, and why."""

    harness: str
    since: datetime | None
    until: datetime | None
    calls: pd.DataFrame
    instances: pd.DataFrame
    dropped: Mapping[str, int] = field(default_factory=dict)
    throttle_s: float = 0.0
    unthrottled: bool = True

    @property
    def call_count(self) -> int:
        return int(self.calls.shape[0])

    @property
    def instance_count(self) -> int:
        return int(self.instances.shape[0])

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary (what the CLI prints and the curve row stores as its window)."""
        return {
            "harness": self.harness,
            "since": self.since.isoformat() if self.since else None,
            "until": self.until.isoformat() if self.until else None,
            "calls": self.call_count,
            "instances": self.instance_count,
            "dropped": dict(self.dropped),
            "unthrottled": self.unthrottled,
            "throttle_s_removed": round(self.throttle_s, 3),
        }


def _check_window(since: datetime | None, until: datetime | None) -> None:
    problems = []
    for name, value in (("since", since), ("until", until)):
        if value is not None and value.tzinfo is None:
            problems.append(f"{name}: must be timezone-aware")
    if not problems and since is not None and until is not None and since >= until:
        problems.append(f"since ({since.isoformat()}) must be before until ({until.isoformat()})")
    if problems:
        raise ConfigError("time window", problems)


def load_fit_window(
    engine: Engine,
    harness: str,
    since: datetime | None = None,
    until: datetime | None = None,
    *,
    unthrottled: bool = True,
) -> FitWindow:
    """The ``fit_curve`` tables of ``harness`` for instances that ran inside [since, until).

    See the module docstring for which calls and instances count, and for ``unthrottled``
    (ages on the task's own clock, throttling time removed; False: the gateway's wall-clock
    ages). ``since``/``until`` must be timezone-aware (None: unbounded). Never raises for an
    empty window: the tables are empty.
    """
    check_harness(harness)
    _check_window(since, until)
    harness_match = or_(
        LlmCall.harness == harness, and_(LlmCall.harness.is_(None), Run.harness == harness)
    )
    query = (
        select(
            LlmCall.run_id,
            LlmCall.instance_id,
            LlmCall.requested_at,
            LlmCall.task_age_s,
            LlmCall.input_tokens,
            LlmCall.cached_input_tokens,
            LlmCall.output_tokens,
            LlmCall.status,
            LlmCall.pacer_wait_s,
            LlmCall.sent_at,
            InstanceResult.state,
            InstanceResult.started_at,
            InstanceResult.running_at,
            InstanceResult.finished_at,
        )
        .join(Run, Run.id == LlmCall.run_id)
        .join(
            InstanceResult,
            and_(
                InstanceResult.run_id == LlmCall.run_id,
                InstanceResult.instance_id == LlmCall.instance_id,
            ),
        )
        .where(harness_match)
        .order_by(LlmCall.id)  # a call's attempts share its request time: keep their order
    )
    if since is not None:
        query = query.where(LlmCall.requested_at >= since)
    if until is not None:
        query = query.where(LlmCall.requested_at < until)
    with readonly(engine).connect() as conn:
        rows = conn.execute(query).all()
    return _window_from_rows(harness, since, until, rows, unthrottled=unthrottled)


def _seconds(values: pd.Series) -> np.ndarray:
    """Datetimes (naive = UTC, as SQLite returns them; or aware) as float seconds since the
    epoch, NaN for None."""
    stamps = pd.to_datetime(values, utc=True, format="mixed")
    seconds = (stamps - pd.Timestamp(0, tz="UTC")).dt.total_seconds()
    return np.asarray(seconds.to_numpy(dtype=np.float64, na_value=np.nan))


_ROW_COLUMNS = [
    "run_id",
    "instance",
    "requested_at",
    "task_age_s",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "status",
    "pacer_wait_s",
    "sent_at",
    "state",
    "started_at",
    "running_at",
    "finished_at",
]


def _throttle_before(df: pd.DataFrame) -> tuple[np.ndarray, pd.Series]:
    """Per row (sorted by instance, then request time): seconds the instance had lost to
    throttling before this request; and per instance, the total lost.

    A 200 lost the time from its request to its send (``sent_at``: the pacer wait, the
    gateway's own checks before it, and when the gateway retried it, the attempts before and
    their retry-afters; on rows without it, ``pacer_wait_s``); any other attempt lost the time until the instance's next request
    (pacer wait, back-off and retry-after: an agent's calls are sequential; none when the
    gateway retried it, its retry sharing its request)."""
    ids = df["instance_id"].to_numpy()
    req = df["req_s"].to_numpy()
    same_next = np.zeros(ids.size, dtype=bool)
    same_next[:-1] = ids[1:] == ids[:-1]
    gap_next = np.zeros(ids.size)
    gap_next[:-1] = req[1:] - req[:-1]
    ok = df["status"].to_numpy() == 200
    wait = np.nan_to_num(pd.to_numeric(df["pacer_wait_s"]).to_numpy(dtype=np.float64))
    to_send = df["sent_s"].to_numpy() - req
    wait = np.where(np.isfinite(to_send), to_send, wait)
    lost = np.where(ok, wait, np.where(same_next, gap_next, 0.0))
    lost = np.maximum(lost, 0.0)
    total = pd.Series(lost, index=df.index).groupby(df["instance_id"]).cumsum().to_numpy()
    return total - lost, pd.Series(lost).groupby(ids).sum()


def _window_from_rows(
    harness: str,
    since: datetime | None,
    until: datetime | None,
    rows: Sequence[Any],
    *,
    unthrottled: bool,
) -> FitWindow:
    df = pd.DataFrame([tuple(r) for r in rows], columns=_ROW_COLUMNS)
    dropped = {
        "calls_of_unfinished_instances": 0,
        "calls_of_aborted_or_lost_instances": 0,
        "calls_of_earlier_attempts": 0,
        "instances_outside_window": 0,
    }
    empty_calls = pd.DataFrame(columns=list(CALL_COLUMNS))
    empty_instances = pd.DataFrame(columns=["instance_id", "wall_time_s"])
    if df.empty:
        return FitWindow(harness, since, until, empty_calls, empty_instances, dropped)
    ok = df["status"] == 200
    natural = df["state"].isin(NATURAL_ENDS) & df["finished_at"].notna()
    unfinished = df["finished_at"].isna() | ~df["state"].isin((*NATURAL_ENDS, "aborted", "lost"))
    dropped["calls_of_unfinished_instances"] = int((unfinished & ok).sum())
    dropped["calls_of_aborted_or_lost_instances"] = int((~natural & ~unfinished & ok).sum())
    df = df[natural].copy()
    if df.empty:
        return FitWindow(harness, since, until, empty_calls, empty_instances, dropped)

    df["instance_id"] = df["run_id"].astype(str) + "/" + df["instance"].astype(str)
    df["req_s"] = _seconds(df["requested_at"])
    df["sent_s"] = _seconds(df["sent_at"])
    # the harness's start; rows before it was recorded have only the claim (boot included)
    running = _seconds(df["running_at"])
    started = np.where(np.isfinite(running), running, _seconds(df["started_at"]))
    age = pd.to_numeric(df["task_age_s"], errors="coerce").to_numpy(dtype=np.float64)
    age = np.where(np.isfinite(age), age, df["req_s"].to_numpy() - started)
    df["age"] = np.maximum(age, 0.0)
    df["origin"] = df["req_s"].to_numpy() - df["age"].to_numpy()
    latest = df.groupby("instance_id")["origin"].transform("max")
    current = df["origin"] >= latest - ATTEMPT_GAP_S
    dropped["calls_of_earlier_attempts"] = int((~current & (df["status"] == 200)).sum())
    df = df[current].sort_values(["instance_id", "req_s"], kind="stable", ignore_index=True)

    df["end"] = _seconds(df["finished_at"])
    per_instance = df.groupby("instance_id").agg(
        origin=("origin", "min"), end=("end", "max"), last_age=("age", "max")
    )
    inside = np.ones(per_instance.shape[0], dtype=bool)
    if since is not None:
        inside &= per_instance["origin"].to_numpy() >= since.timestamp()
    if until is not None:
        inside &= per_instance["end"].to_numpy() <= until.timestamp()
    dropped["instances_outside_window"] = int((~inside).sum())
    per_instance = per_instance[inside]
    df = df[df["instance_id"].isin(per_instance.index)].reset_index(drop=True)
    lost_total = pd.Series(0.0, index=per_instance.index)
    if unthrottled and not df.empty:
        before, lost_total = _throttle_before(df)
        df["age"] = np.maximum(df["age"].to_numpy() - before, 0.0)
        lost_total = lost_total.reindex(per_instance.index, fill_value=0.0)
    df = df[df["status"] == 200]
    last_age = df.groupby("instance_id")["age"].max().reindex(per_instance.index, fill_value=0.0)
    wall = np.maximum(
        per_instance["end"].to_numpy() - per_instance["origin"].to_numpy() - lost_total.to_numpy(),
        last_age.to_numpy(),
    )
    keep = per_instance.index.isin(df["instance_id"].unique())
    instances = pd.DataFrame(
        {"instance_id": per_instance.index.to_numpy()[keep], "wall_time_s": wall[keep]}
    )
    calls = pd.DataFrame(
        {
            "instance_id": df["instance_id"].to_numpy(),
            "t_request_s": df["age"].to_numpy(dtype=np.float64),
            "input_tokens": df["input_tokens"].to_numpy(dtype=np.int64),
            "cached_input_tokens": df["cached_input_tokens"].to_numpy(dtype=np.int64),
            "output_tokens": df["output_tokens"].to_numpy(dtype=np.int64),
        }
    ).sort_values(["instance_id", "t_request_s"], kind="stable", ignore_index=True)
    return FitWindow(
        harness,
        since,
        until,
        calls,
        instances,
        dropped,
        throttle_s=float(lost_total.sum()),
        unthrottled=unthrottled,
    )
