"""One harness call as the gateway tracks it while in flight (``Call``), and what the gateway
keeps of calls (``CallBook``): per alias, the calls in flight (a span of requests is complete
for the cache-counting inference once none requested in it is); per instance, when it first saw
it (the task's age when the harness sends no start time), its previous prompt (the cached part
of the pacer's estimate, since agents resend their history) and the request the provider last
rejected (a harness that resends it is retrying: ``llm_calls.retry``); per call, its
``llm_calls`` row and the alias's latest rate-limit headers (``alias_observations``), handed to
the recorder to write in batches.

Kept apart from the call path (``gateway.app``), which decides what happens to a call, so that
what is remembered and recorded about it reads in one place.
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import httpx
from starlette.requests import Request

from gateway.aliases import Alias
from gateway.pacing import CallEstimate, Permit
from gateway.recorder import CallRecorder, Observation
from gateway.spend import Reservation
from gateway.wire import CallUsage, passthrough_headers
from ledger.models import SERVED_STATUSES
from ledger.throttle_reading import ThrottleReading
from planner.classify import LimitType

__all__ = ["Call", "CallBook"]


#: instances each of the book's memories keeps (the oldest touched are forgotten first)
MAX_REMEMBERED_INSTANCES = 200_000

K = TypeVar("K")
V = TypeVar("V")


def _digest(raw_body: bytes) -> bytes:
    return hashlib.blake2b(raw_body, digest_size=16).digest()


def _remember(memory: OrderedDict[K, V], key: K, value: V) -> None:
    """Set ``key`` as the most recently touched, forgetting the oldest past the bound."""
    memory[key] = value
    memory.move_to_end(key)
    while len(memory) > MAX_REMEMBERED_INSTANCES:
        memory.popitem(last=False)


@dataclass
class Call:
    """What the gateway knows about one harness call while it is in flight."""

    alias: Alias
    flavour: str
    reservation: Reservation
    instance: str | None
    harness: str | None
    task_age_s: float | None
    requested_at: datetime
    input_estimate: int
    max_tokens: int
    task_timeout_s: float | None = None  # the harness's x-evalfleet-task-timeout-s
    raw_body: bytes = b""  # the request as the harness sent it: a resend repeats it
    retry: bool = False  # this attempt repeats a request the provider rejected
    permit: Permit | None = None
    settled: bool = False
    usage: CallUsage = field(default_factory=CallUsage)


class CallBook:
    """The gateway's memory of instances (bounded: the oldest are forgotten) and its records of
    their calls."""

    def __init__(
        self,
        recorder: CallRecorder,
        clock: Callable[[], float],
        vouches: Callable[[str], bool] = lambda _alias: True,
    ) -> None:
        self._recorder = recorder
        self._clock = clock
        # whether this gateway's calls in flight are all of an alias's: with other replicas
        # serving it, its word that every call before a time is recorded would be wrong
        self._vouches = vouches
        self._first_seen: OrderedDict[tuple[str, str], float] = OrderedDict()
        self._last_input: OrderedDict[tuple[str, str], int] = OrderedDict()
        self._rejected: OrderedDict[tuple[str, str], bytes] = OrderedDict()
        # per alias, the calls in flight (from their creation to their settling) by request
        # time, in the order they were created: the first is the oldest, to within the
        # milliseconds a reservation takes
        self._in_flight: dict[str, OrderedDict[int, datetime]] = {}

    def started(self, call: Call) -> None:
        """The call is in flight until ``finished``."""
        self._in_flight.setdefault(call.alias.name, OrderedDict())[id(call)] = call.requested_at

    def finished(self, call: Call) -> None:
        """The call's last ``llm_calls`` row was recorded (or it had none): no longer in flight."""
        calls = self._in_flight.get(call.alias.name)
        if calls is not None:
            calls.pop(id(call), None)

    def complete_before(self, alias: str, now: datetime) -> datetime:
        """Every call of ``alias`` requested before this has been answered and recorded."""
        calls = self._in_flight.get(alias)
        if not calls:
            return now
        return min(now, next(iter(calls.values())))

    def estimate(self, call: Call) -> CallEstimate:
        """The pacer's estimate: the cached part is the instance's previous prompt (agents
        resend their history), the rest uncached; output ``max_tokens``; the task's age (it
        orders the pacer's queue under an output limit) and its instance timeout (near it the
        task's calls go first where the alias sets ``pacer.urgent_share``)."""
        key = (call.reservation.run_id, call.instance or "")
        cached = 0
        if call.instance is not None:
            cached = min(call.input_estimate, self._last_input.get(key, 0))
            _remember(self._last_input, key, call.input_estimate)
        return CallEstimate(
            input_uncached=call.input_estimate - cached,
            input_cached=cached,
            max_output=call.max_tokens,
            task_age_s=call.task_age_s,
            task_timeout_s=call.task_timeout_s,
        )

    def check_resend(self, call: Call) -> None:
        """Mark the call a retry when its instance's last request, which the provider
        rejected, had the same body (the harness's SDK retrying after the gateway gave up).
        The body is hashed only for an instance with a rejection remembered: most calls cost
        a dict lookup."""
        if call.instance is None:
            return
        remembered = self._rejected.get((call.reservation.run_id, call.instance))
        if remembered is not None and remembered == _digest(call.raw_body):
            call.retry = True

    def note_outcome(self, call: Call, rejected: bool) -> None:
        """Remember the request the provider rejected (per instance, bounded), or forget it."""
        if call.instance is None:
            return
        key = (call.reservation.run_id, call.instance)
        if not rejected:
            self._rejected.pop(key, None)
            return
        _remember(self._rejected, key, _digest(call.raw_body))

    def task_age(self, request: Request, run_id: str, instance: str | None) -> float | None:
        """Seconds since the task started: its ``x-evalfleet-task-started-at`` (epoch seconds),
        else since the gateway first saw the instance (None for a call of no instance)."""
        now = self._clock()
        stated = request.headers.get("x-evalfleet-task-started-at")
        if stated is not None:
            try:
                started = float(stated)
            except ValueError:
                started = math.nan
            if math.isfinite(started):  # "inf", "nan" or junk: as if the harness sent none
                return max(0.0, now - started)
        if instance is None:
            return None
        key = (run_id, instance)
        first = self._first_seen.get(key, now)
        _remember(self._first_seen, key, first)
        return now - first

    @staticmethod
    def task_timeout(request: Request) -> float | None:
        """The task's instance timeout in seconds, from ``x-evalfleet-task-timeout-s`` (None
        when absent or not a finite positive number: the call is then never urgent)."""
        stated = request.headers.get("x-evalfleet-task-timeout-s")
        if stated is None:
            return None
        try:
            value = float(stated)
        except ValueError:
            return None
        return value if math.isfinite(value) and value > 0 else None

    def record(
        self, call: Call, status: int, latency_s: float, limit: str | None, *, sent_at: float
    ) -> int:
        """Queue the attempt's ``llm_calls`` row (usage and cost of a 200, or of the part of a
        stream relayed before the harness hung up, only), sent upstream at ``sent_at`` (the
        gateway's clock, epoch seconds); its cost."""
        usage = call.usage if status in SERVED_STATUSES else CallUsage()
        cost = call.alias.prices.cost_micro_usd(usage.uncached, usage.input_cached, usage.output)
        self._recorder.record(
            {
                "run_id": call.reservation.run_id,
                "instance_id": call.instance,
                "alias": call.alias.name,
                "harness": call.harness,
                "requested_at": call.requested_at,
                "sent_at": datetime.fromtimestamp(sent_at, UTC),
                "task_age_s": call.task_age_s,
                "input_tokens": usage.input_total,
                "cached_input_tokens": usage.input_cached,
                "output_tokens": usage.output,
                "latency_s": latency_s,
                "pacer_wait_s": call.permit.waited_s if call.permit else 0.0,
                "status": status,
                "limit_type": limit,
                "cost_micro_usd": cost,
                "retry": call.retry,
            }
        )
        return cost

    def observe(
        self,
        call: Call,
        upstream: httpx.Response,
        limit_type: LimitType,
        limits: Any,
        remaining: Any,
        latency_s: float,
        *,
        counted_cache_reads: bool = False,
    ) -> None:
        """Keep the alias's latest rate-limit headers, and what a 429 stated, for the planner;
        ``latency_s``: from the attempt's send to these headers; ``counted_cache_reads``: the
        gateway judged this token 429 to say the provider counts cache reads."""
        headers = {
            k: v for k, v in passthrough_headers(upstream.headers).items() if "ratelimit" in k
        }
        if not headers:
            return
        limited = limit_type not in (LimitType.NONE, LimitType.OVERLOAD)
        now = datetime.now(UTC)
        sent_at = now - timedelta(seconds=max(0.0, latency_s))
        self._recorder.observe(
            Observation(
                alias=call.alias.name,
                observed_at=now,
                status=upstream.status_code,
                headers=headers,
                limits=(
                    {
                        "limits": {str(k): v for k, v in limits.items()},
                        "remaining": {str(k): v for k, v in (remaining or {}).items()},
                    }
                    if limits
                    else {}
                ),
                last_limit_type=limit_type.value if limited else None,
                last_limited_at=now if limited else None,
                complete_before=(
                    self.complete_before(call.alias.name, now)
                    if self._vouches(call.alias.name)
                    else None
                ),
                answered_sent_at=sent_at,
                throttle_limits=(
                    {str(k): float(v) for k, v in limits.items()} if limited and limits else {}
                ),
                throttle_reading=(
                    ThrottleReading.of_429(
                        limit_type.value,
                        {str(k): float(v) for k, v in (limits or {}).items()},
                        {str(k): float(v) for k, v in (remaining or {}).items()},
                        sent_at,
                        counted_cache_reads,
                    )
                    if limited
                    else None
                ),
            )
        )
