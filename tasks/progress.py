"""A run's live progress: counts by state, tokens, cost, 429s and when it last changed.

The ledger is the truth; everything here is derived from it and can be thrown away:

* ``from_ledger(run_id)`` computes a run's ``Progress`` (instance counts from
  ``instance_results``; calls, tokens, cost and 429s from the gateway's ``llm_calls``, which see
  every attempt as it happens; the alias's latest planner ceiling and binding constraint);
  ``updated_at`` is the latest change the ledger records, so a rebuild gives the same value.
* ``publish(run_id)`` writes it to a Valkey/Redis hash ``evalfleet:run:<id>:progress`` when
  ``EVALFLEET_VALKEY_URL`` is set; ``read(run_id)`` returns the hash, rebuilding it from the
  ledger when it was wiped.
* ``publish_artifact(progress)`` keeps one Prefect progress artifact per run (key
  ``evalfleet-run-<id>``) at the share of instances that are terminal, with a one-line summary.

``evalfleet status`` prints ``from_ledger``; the supervisor publishes every open run each tick
and instances publish their run after landing (best effort: Redis is derived, a Redis outage
is logged and must not requeue a finished instance).
"""

from __future__ import annotations

import functools
import logging
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import func, select

from evalfleet.errors import NotFound
from evalfleet.settings import get_settings
from evalfleet.states import INSTANCE_TERMINAL, RunState
from ledger.models import InstanceResult, LlmCall, PlannerDecision, Run
from tasks.ledger_io import engine

log = logging.getLogger(__name__)
_TERMINAL = frozenset(s.value for s in INSTANCE_TERMINAL)
_OPEN_RUNS = (
    RunState.LAUNCHING.value,
    RunState.RUNNING.value,
    RunState.PAUSED.value,
    RunState.DRAINING.value,
)
_INTS = (
    "total",
    "terminal",
    "calls",
    "input_tokens",
    "cached_input_tokens",
    "output_tokens",
    "cost_micro_usd",
    "rate_limited",
)


@dataclass(frozen=True)
class Progress:
    """One run's progress, as the ledger says it is."""

    run_id: str
    name: str
    alias: str
    state: str
    counts: dict[str, int] = field(default_factory=dict)
    calls: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    output_tokens: int = 0
    cost_micro_usd: int = 0
    rate_limited: int = 0
    ceiling: int | None = None
    binding: str | None = None
    failure_reason: str | None = None
    updated_at: datetime | None = None

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def terminal(self) -> int:
        return sum(n for s, n in self.counts.items() if s in _TERMINAL)

    @property
    def fraction_done(self) -> float:
        return self.terminal / self.total if self.total else 0.0

    def as_hash(self) -> dict[str, str]:
        """The Valkey hash: flat string fields (``count:<state>`` per state present)."""
        fields = {
            "run_id": self.run_id,
            "name": self.name,
            "alias": self.alias,
            "state": self.state,
            "total": str(self.total),
            "terminal": str(self.terminal),
            "calls": str(self.calls),
            "input_tokens": str(self.input_tokens),
            "cached_input_tokens": str(self.cached_input_tokens),
            "output_tokens": str(self.output_tokens),
            "cost_micro_usd": str(self.cost_micro_usd),
            "rate_limited": str(self.rate_limited),
            "ceiling": "" if self.ceiling is None else str(self.ceiling),
            "binding": self.binding or "",
            "failure_reason": self.failure_reason or "",
            "updated_at": self.updated_at.isoformat() if self.updated_at else "",
        }
        fields.update({f"count:{s}": str(n) for s, n in sorted(self.counts.items())})
        return fields

    @classmethod
    def from_hash(cls, data: dict[str, str]) -> Progress:
        """Read a hash written by ``as_hash`` back."""
        ints = {k: int(data[k]) for k in _INTS if k not in ("total", "terminal")}
        return cls(
            run_id=data["run_id"],
            name=data["name"],
            alias=data["alias"],
            state=data["state"],
            counts={
                k.removeprefix("count:"): int(v) for k, v in data.items() if k.startswith("count:")
            },
            ceiling=int(data["ceiling"]) if data.get("ceiling") else None,
            binding=data.get("binding") or None,
            failure_reason=data.get("failure_reason") or None,
            updated_at=datetime.fromisoformat(data["updated_at"])
            if data.get("updated_at")
            else None,
            **ints,
        )

    def summary(self) -> str:
        """One line: state, counts, calls, tokens, cost, 429s, ceiling (binding)."""
        counts = " ".join(f"{k}={v}" for k, v in sorted(self.counts.items()))
        return (
            f"[{self.state}] {self.terminal}/{self.total} done: {counts} | calls {self.calls} "
            f"in {self.input_tokens:,} (cached {self.cached_input_tokens:,}) "
            f"out {self.output_tokens:,} tok | ${self.cost_micro_usd / 1e6:.4f} | "
            f"429s {self.rate_limited} | ceiling {self.ceiling} ({self.binding})"
        )


def _utc(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def from_ledger(run_id: str) -> Progress:
    """The run's progress computed from the ledger (NotFound for an unknown run)."""
    with engine().connect() as conn:
        run = conn.execute(
            select(
                Run.id, Run.name, Run.alias, Run.state, Run.failure_reason, Run.updated_at
            ).where(Run.id == run_id)
        ).one_or_none()
        if run is None:
            raise NotFound(f"run {run_id} does not exist")
        counts = {
            s: int(n)
            for s, n in conn.execute(
                select(InstanceResult.state, func.count())
                .where(InstanceResult.run_id == run_id)
                .group_by(InstanceResult.state)
            ).all()
        }
        last_instance = conn.execute(
            select(func.max(InstanceResult.started_at), func.max(InstanceResult.finished_at)).where(
                InstanceResult.run_id == run_id
            )
        ).one()
        calls = conn.execute(
            select(
                func.count(),
                func.coalesce(func.sum(LlmCall.input_tokens), 0),
                func.coalesce(func.sum(LlmCall.cached_input_tokens), 0),
                func.coalesce(func.sum(LlmCall.output_tokens), 0),
                func.coalesce(func.sum(LlmCall.cost_micro_usd), 0),
                func.count().filter(LlmCall.status == 429),
                func.max(LlmCall.requested_at),
            ).where(LlmCall.run_id == run_id)
        ).one()
        decision = conn.execute(
            select(PlannerDecision.ceiling, PlannerDecision.binding)
            .where(PlannerDecision.alias == run.alias)
            .order_by(PlannerDecision.id.desc())
            .limit(1)
        ).one_or_none()
    changes = [t for t in (_utc(run.updated_at), *map(_utc, last_instance), _utc(calls[6])) if t]
    return Progress(
        run_id=run.id,
        name=run.name,
        alias=run.alias,
        state=run.state,
        counts=counts,
        calls=int(calls[0]),
        input_tokens=int(calls[1]),
        cached_input_tokens=int(calls[2]),
        output_tokens=int(calls[3]),
        cost_micro_usd=int(calls[4]),
        rate_limited=int(calls[5]),
        ceiling=int(decision.ceiling) if decision is not None else None,
        binding=str(decision.binding) if decision is not None else None,
        failure_reason=run.failure_reason,
        updated_at=max(changes) if changes else None,
    )


def hash_key(run_id: str) -> str:
    return f"evalfleet:run:{run_id}:progress"


@functools.cache
def _valkey(url: str) -> Any:
    import redis

    return redis.Redis.from_url(
        url, socket_timeout=5, socket_connect_timeout=5, decode_responses=True
    )


def valkey() -> Any | None:
    """The Valkey/Redis client of ``EVALFLEET_VALKEY_URL``, or None when it is not set."""
    url = get_settings().valkey_url
    return _valkey(url) if url else None


def publish(run_id: str) -> Progress:
    """Compute the run's progress from the ledger and replace its Valkey hash (if configured)."""
    progress = from_ledger(run_id)
    client = valkey()
    if client is not None:
        pipe = client.pipeline(transaction=True)
        pipe.delete(hash_key(run_id))
        pipe.hset(hash_key(run_id), mapping=progress.as_hash())
        pipe.execute()
    return progress


def read(run_id: str) -> Progress:
    """The run's progress from Valkey, rebuilt from the ledger if the hash is missing (wiped);
    straight from the ledger when no Valkey URL is set."""
    client = valkey()
    if client is None:
        return from_ledger(run_id)
    data = client.hgetall(hash_key(run_id))
    if not data:
        return publish(run_id)
    return Progress.from_hash(data)


def publish_quietly(run_id: str) -> None:
    """``publish`` for callers whose own work is done (an instance that landed), only when a
    Valkey URL is set: a Valkey outage is logged, not raised — the hash is derived and the
    supervisor republishes it every tick."""
    from redis.exceptions import RedisError

    if valkey() is None:
        return
    try:
        publish(run_id)
    except RedisError as exc:  # logged; the ledger already holds the truth
        log.warning("progress of run %s not published to Valkey: %s", run_id, exc)


def artifact_key(run_id: str) -> str:
    return f"evalfleet-run-{run_id.lower()}"


def publish_artifact(progress: Progress) -> uuid.UUID:
    """Create or update the run's Prefect progress artifact; returns its id."""
    from prefect import get_client
    from prefect.artifacts import create_progress_artifact, update_progress_artifact
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    key = artifact_key(progress.run_id)
    percent = round(100.0 * progress.fraction_done, 1)
    description = f"{progress.name} ({progress.run_id}): {progress.summary()}"
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])), limit=1
        )
    if found:
        artifact_id: uuid.UUID = found[0].id
        update_progress_artifact(artifact_id, percent, description=description)
        return artifact_id
    created = create_progress_artifact(percent, key=key, description=description)
    return cast(uuid.UUID, created)  # sync caller: the id, not a coroutine


def open_run_ids() -> list[str]:
    """Runs whose progress still changes (launching, running, paused, draining)."""
    with engine().connect() as conn:
        return list(conn.execute(select(Run.id).where(Run.state.in_(_OPEN_RUNS))).scalars())


def publish_runs(run_ids: list[str]) -> list[Progress]:
    """Publish each run to Valkey (if configured) and to its Prefect progress artifact.

    A Valkey or Prefect API failure is logged per run and the others are still published:
    progress is derived, and the supervisor that calls this has more vital work each tick.
    """
    import httpx
    from prefect.exceptions import PrefectHTTPStatusError
    from redis.exceptions import RedisError

    published = []
    for run_id in run_ids:
        try:
            progress = publish(run_id)
            publish_artifact(progress)
        except (RedisError, PrefectHTTPStatusError, httpx.HTTPError) as exc:
            log.warning("progress of run %s not published: %s", run_id, exc)
            continue
        published.append(progress)
    return published
