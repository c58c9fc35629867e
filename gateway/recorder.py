"""Call recording off the gateway's hot path: ``llm_calls`` rows and per-alias observations.

The gateway hands each finished attempt (retries included) to ``CallRecorder.record`` — a list
append — and a background task writes them in batches every ``flush_interval_s`` (one
``executemany`` in a worker thread). The latest rate-limit headers per alias are kept in memory
and upserted into ``alias_observations`` with the same flush, for the planner. ``flush()``
writes everything pending (used at shutdown and by tests); ``close()`` flushes and stops.
A failed write is logged (no secrets are ever in a row) and retried at the next flush, bounded
by ``max_pending`` rows so a dead database cannot grow memory without limit.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import insert
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from ledger.clock import as_utc
from ledger.models import (
    ANSWERED_SENT_AT_KEY,
    COMPLETE_BEFORE_KEY,
    THROTTLE_LIMITS_KEY,
    THROTTLE_READING_KEY,
    AliasObservation,
    LlmCall,
)
from ledger.throttle_reading import ThrottleReading, numeric_entries
from planner.classify import parse_rate_limit_headers

log = logging.getLogger(__name__)


@dataclass
class Observation:
    """The latest rate-limit headers of an alias."""

    alias: str
    observed_at: datetime
    status: int
    headers: dict[str, str]
    limits: dict[str, Any]
    last_limit_type: str | None = None
    last_limited_at: datetime | None = None
    # the limits (per minute, by limit type) the last 429 stated, from its headers and message:
    # a limit only a 429's message states (OpenAI's output-token limit) is in no later header
    throttle_limits: dict[str, float] = field(default_factory=dict)
    # a token 429's reading of its bucket: this observation's own, merged by the recorder into
    # the first of its storm (ledger.throttle_reading), kept through later successes
    throttle_reading: ThrottleReading | None = None
    # every call of the alias requested before this had been answered (its row recorded before
    # this observation): a span of sent calls that ends by then is complete (tasks.plan_counting)
    complete_before: datetime | None = None
    # when the attempt that carried these headers was sent upstream: every call sent before it
    # is charged in the remaining they state (planner.cache_counting.dip_window)
    answered_sent_at: datetime | None = None


def parsed_limits(obs: Observation) -> dict[str, Any]:
    """Limits and remaining per class as the headers state them (parsed at flush, not per call)."""
    hdrs = parse_rate_limit_headers(obs.headers, now_epoch=obs.observed_at.timestamp())
    return {
        "limits": {str(k): v for k, v in hdrs.limits.items()},
        "remaining": {str(k): v for k, v in hdrs.remaining.items()},
    }


@dataclass(frozen=True)
class _Throttle:
    """An alias's last 429: its type, time and stated limits (sticky until the next one), and
    the first token 429 of the latest storm (``ledger.throttle_reading``)."""

    limit_type: str | None
    limited_at: datetime | None
    limits: dict[str, float]
    reading: ThrottleReading | None = None

    def followed_by(self, obs: Observation) -> _Throttle:
        """After ``obs``, a 429: its type, time and limits; the storm's first token reading."""
        reading = obs.throttle_reading
        if self.reading is not None:
            reading = self.reading.followed_by(reading)
        return _Throttle(
            obs.last_limit_type, obs.last_limited_at, dict(obs.throttle_limits), reading
        )

    @classmethod
    def stored(cls, row: AliasObservation | None) -> _Throttle:
        """From ``alias_observations`` (none yet: no 429 seen)."""
        if row is None:
            return cls(None, None, {})
        stored = row.limits if isinstance(row.limits, dict) else {}
        limits = numeric_entries(stored.get(THROTTLE_LIMITS_KEY))
        reading = ThrottleReading.from_json(stored.get(THROTTLE_READING_KEY))
        return cls(row.last_limit_type, row.last_limited_at, limits, reading)

    def later_than(self, limited_at: datetime | None) -> bool:
        """This 429 came after ``limited_at`` (None: no 429 at all)."""
        if self.limited_at is None:
            return False
        return limited_at is None or as_utc(self.limited_at) > as_utc(limited_at)

    def carry_into(self, obs: Observation) -> None:
        obs.last_limit_type, obs.last_limited_at = self.limit_type, self.limited_at
        obs.throttle_limits = dict(self.limits)
        obs.throttle_reading = self.reading


@dataclass
class CallRecorder:
    """Buffers ``llm_calls`` rows and observations; writes them in batches."""

    sessions: sessionmaker[Session]
    flush_interval_s: float = 0.25
    max_pending: int = 100_000
    _rows: list[dict[str, Any]] = field(default_factory=list)
    _observations: dict[str, Observation] = field(default_factory=dict)
    # per alias, its last 429 (from this process, else read once from the ledger at a write)
    _throttles: dict[str, _Throttle] = field(default_factory=dict)
    _task: asyncio.Task[None] | None = None
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    dropped: int = 0

    def record(self, row: dict[str, Any]) -> None:
        """Queue one ``llm_calls`` row (keys are LlmCall column names)."""
        if len(self._rows) >= self.max_pending:
            self.dropped += 1
            log.error("llm_calls buffer full (%d rows): dropping a row", self.max_pending)
            return
        self._rows.append(row)

    def observe(self, obs: Observation) -> None:
        """Keep the alias's latest headers; a 429's limit type and stated limits stick until the
        next 429, and a storm's first token reading through the storm, across flushes and
        gateway restarts (``_write`` reads the ledger's once)."""
        last = self._throttles.get(obs.alias)
        if obs.last_limit_type is not None:
            # a token 429 in a storm keeps the storm's first reading (ledger.throttle_reading)
            throttle = (last or _Throttle(None, None, {})).followed_by(obs)
            self._throttles[obs.alias] = throttle
            throttle.carry_into(obs)
        elif last is not None:
            last.carry_into(obs)
        self._observations[obs.alias] = obs

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="evalfleet-call-recorder")

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.flush_interval_s)
            await self.flush()

    async def flush(self) -> None:
        """Write everything pending now."""
        async with self._lock:
            rows, self._rows = self._rows, []
            observations = list(self._observations.values())
            if not rows and not observations:
                return
            try:
                await asyncio.to_thread(self._write, rows, observations)
            except SQLAlchemyError as exc:
                log.error("writing %d llm_calls rows failed: %s", len(rows), type(exc).__name__)
                self._rows[:0] = rows
                return
            for obs in observations:
                if self._observations.get(obs.alias) is obs:
                    del self._observations[obs.alias]

    def _write(self, rows: list[dict[str, Any]], observations: list[Observation]) -> None:
        with self.sessions.begin() as session:
            if rows:
                session.execute(insert(LlmCall), rows)
            for obs in observations:
                stored = _Throttle.stored(session.get(AliasObservation, obs.alias))
                if stored.later_than(obs.last_limited_at):
                    # the row holds a later 429 than this gateway has seen: one before a
                    # restart, or another replica's (gateway.replica_sync); it sticks. A
                    # gateway that has seen none carries it from now on (setdefault: a 429
                    # observed meanwhile on the event loop wins)
                    stored.carry_into(obs)
                    self._throttles.setdefault(obs.alias, stored)
                limits = dict(obs.limits or parsed_limits(obs))
                if obs.throttle_limits:
                    limits[THROTTLE_LIMITS_KEY] = obs.throttle_limits
                if obs.throttle_reading is not None:
                    limits[THROTTLE_READING_KEY] = obs.throttle_reading.to_json()
                if obs.complete_before is not None:
                    limits[COMPLETE_BEFORE_KEY] = obs.complete_before.timestamp()
                if obs.answered_sent_at is not None:
                    limits[ANSWERED_SENT_AT_KEY] = obs.answered_sent_at.timestamp()
                session.merge(
                    AliasObservation(
                        alias=obs.alias,
                        observed_at=obs.observed_at,
                        status=obs.status,
                        headers=obs.headers,
                        limits=limits,
                        last_limit_type=obs.last_limit_type,
                        last_limited_at=obs.last_limited_at,
                    )
                )

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self.flush()
