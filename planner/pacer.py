"""The pacer core: admits LLM calls against an alias's budgets, with the clock passed in.

Both the discrete-event simulator and the gateway (an asyncio wrapper) use this one admission
rule, so what the benchmark measures is what production runs. It owns:
- per-second token buckets for calls/s, counted tokens/s and (optionally) output tokens/s, each
  of capacity ``rate * burst_s`` (the calls bucket holds at least one call), refilled
  continuously, starting full; a class whose bucket the provider states (``observe_remaining``)
  is ``stated_burst_s`` deep from then on: the provider's own bucket (a minute of a per-minute
  limit), mirrored, so its burst is used as the provider allows and never beyond what it says
  remains (docs/bench-planner.md, fortieth round);
- an in-flight token budget: the sum of the in-flight calls' tokens (all input, cached or not,
  plus ``max_output``: the context the provider is working on) stays within it;
- a queue with head-of-line order: only the head may be admitted. Which call is the head
  (FIFO under the calls bucket, smallest prompt first under the counted-token bucket, old
  tasks first under the output bucket) is ``planner.pacer_order``'s.
  A call larger than a bucket's capacity is admitted when that bucket is full, and one larger
  than the in-flight budget when nothing is in flight; it leaves the bucket in debt, so the
  long-run rate still holds and nothing dead-locks;
- settlement: calls are charged on their estimate (uncached input, plus cached input when the
  provider counts it, plus ``max_output`` for a combined token class / the output bucket) and
  ``release`` settles the estimate against actual usage (a failed call with no usage is
  refunded its tokens, not its call) and frees its in-flight tokens;
- live budget updates from the planner (``set_budgets``): levels are clipped to the new
  capacities, nothing admitted is revoked.

Usage: ``request`` enqueues a call and says whether it is admitted now (else a lower bound of
its wait; ``inf`` means it waits for a release). ``poll(now)`` returns the calls admitted since
the last poll (in admission order); ``next_ready_at(now)`` says when the head can go if
nothing is released meanwhile. Pure: no clock reads, no I/O; time is seconds, non-decreasing.

Re-exported here: the hold after a 429 (``planner.pacer_holds``), the queue order's ageing
(``planner.pacer_order``) and the values the core takes and returns (``planner.pacer_types``).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass

from planner.budgets import BudgetClass, Budgets, TokenClass
from planner.pacer_bucket import Bucket as _Bucket
from planner.pacer_holds import (
    DAILY_HOLD_MAX_S,
    EVERY_BUCKET,
    HOLD_AFTER_429_S,
    classes_to_hold,
    hold_seconds,
)
from planner.pacer_order import AGEING_TOKENS_PER_S, QueueOrder
from planner.pacer_types import Admission, CallEstimate, CallUsage, PacerUsage

__all__ = [
    "AGEING_TOKENS_PER_S",
    "DAILY_HOLD_MAX_S",
    "DEFAULT_BURST_S",
    "DEFAULT_STATED_BURST_S",
    "EVERY_BUCKET",
    "HOLD_AFTER_429_S",
    "Admission",
    "CallEstimate",
    "CallUsage",
    "PacerCore",
    "PacerUsage",
    "classes_to_hold",
    "hold_seconds",
]

#: Bucket depths (seconds of each rate) the simulator's planner runs with, and the gateway's
#: defaults: where the provider states nothing of a bucket, and once it states it (its own
#: one-minute bucket, mirrored). Measured on the simulator (docs/bench-planner.md, fortieth
#: round): on 339 header-less runs a 20 s bucket met every target on 289 where 2 s met 278,
#: 0.33% faster on the mean with as many 429s; on 451 runs with headers, a 2 s bucket met 410
#: where the stated minute met 441, 3% slower on the mean.
DEFAULT_BURST_S = 20.0
DEFAULT_STATED_BURST_S = 60.0


@dataclass(frozen=True)
class _Charge:
    counted: int
    output: int
    inflight: int


class PacerCore:
    """Head-of-line admission against calls/s, counted tokens/s, output tokens/s and in-flight
    tokens (FIFO, or smallest prompt first under a token limit: ``planner.pacer_order``;
    ``urgent_share``: a task that has run that share of its instance timeout goes first)."""

    def __init__(
        self,
        budgets: Budgets,
        burst_s: float,
        *,
        stated_burst_s: float | None = None,
        token_class: TokenClass = "input",
        cached_input_counts: bool = False,
        now: float = 0.0,
        urgent_share: float | None = None,
    ) -> None:
        if not (math.isfinite(burst_s) and burst_s > 0):
            raise ValueError(f"burst_s must be a positive number of seconds, got {burst_s!r}")
        if stated_burst_s is not None and not (
            math.isfinite(stated_burst_s) and stated_burst_s > 0
        ):
            raise ValueError(
                f"stated_burst_s must be a positive number of seconds, got {stated_burst_s!r}"
            )
        self.burst_s = burst_s
        self.stated_burst_s = stated_burst_s
        # the classes whose bucket the provider has stated: they are stated_burst_s deep
        self._stated: set[BudgetClass] = set()
        self.token_class: TokenClass = token_class
        self.cached_input_counts = cached_input_counts
        self._now = now
        self._budgets = budgets
        self._calls = _Bucket(budgets.calls_per_s, self._calls_capacity(budgets.calls_per_s))
        self._tokens = _Bucket(budgets.tokens_per_s, budgets.tokens_per_s * burst_s)
        self._output: _Bucket | None = None
        if budgets.output_tokens_per_s is not None:
            self._output = _Bucket(
                budgets.output_tokens_per_s, budgets.output_tokens_per_s * burst_s
            )
        self._inflight_budget = budgets.inflight_tokens
        self._inflight = 0
        # (priority, arrival sequence, call id, estimate, charge, arrival time): a heap, the
        # head at [0]
        self._queue: list[tuple[float, int, str, CallEstimate, _Charge, float]] = []
        self._arrivals = 0
        self._queued_ids: set[str] = set()
        self._order = QueueOrder(urgent_share)
        self._admitted: dict[str, tuple[CallEstimate, _Charge]] = {}
        self._unreported: list[str] = []
        self._usage_start = now
        self._used_calls = 0.0
        self._used_tokens = 0.0
        self._used_output = 0.0
        self._peak_inflight = 0.0

    # -- introspection ------------------------------------------------------------------------
    @property
    def budgets(self) -> Budgets:
        return self._budgets

    @property
    def queue_len(self) -> int:
        return len(self._queue)

    @property
    def inflight_tokens(self) -> int:
        return self._inflight

    @property
    def inflight_calls(self) -> int:
        return len(self._admitted)

    def levels(self, now: float) -> dict[str, float]:
        """Bucket levels at ``now`` (may be negative after an oversize call)."""
        self._advance(now)
        out = {"calls": self._calls.level, "tokens": self._tokens.level}
        if self._output is not None:
            out["output_tokens"] = self._output.level
        return out

    # -- helpers -----------------------------------------------------------------------------
    def _depth(self, cls: BudgetClass) -> float:
        """Seconds of its rate the class's bucket holds (``stated_burst_s`` once stated)."""
        if self.stated_burst_s is not None and cls in self._stated:
            return self.stated_burst_s
        return self.burst_s

    def _calls_capacity(self, rate: float) -> float:
        return max(rate * self._depth(BudgetClass.REQUESTS), 1.0)

    def _advance(self, now: float) -> None:
        dt = now - self._now
        if dt > 0:
            self._calls.refill(dt)
            self._tokens.refill(dt)
            if self._output is not None:
                self._output.refill(dt)
            self._now = now

    def _charge(self, est: CallEstimate) -> _Charge:
        counted = est.input_uncached + (est.input_cached if self.cached_input_counts else 0)
        if self.token_class == "combined":
            counted += est.max_output
        inflight = est.input_uncached + est.input_cached + est.max_output
        return _Charge(counted=counted, output=est.max_output, inflight=inflight)

    def _inflight_blocks(self, charge: _Charge) -> bool:
        return self._inflight > 0 and self._inflight + charge.inflight > self._inflight_budget

    def _rate_waits(self, charge: _Charge) -> tuple[float, float, float]:
        """Seconds until the calls, the counted-token and the output buckets hold ``charge``."""
        output = 0.0 if self._output is None else self._output.wait_for(charge.output)
        return self._calls.wait_for(1.0), self._tokens.wait_for(charge.counted), output

    def _wait(self, charge: _Charge) -> float:
        """Seconds until ``charge`` could be admitted (``inf``: blocked on in-flight)."""
        if self._inflight_blocks(charge):
            return math.inf
        calls, tokens, output = self._rate_waits(charge)
        longest = calls if calls > tokens else tokens
        return output if output > longest else longest

    def _admit(self, call_id: str, est: CallEstimate, charge: _Charge) -> None:
        self._calls.level -= 1.0
        self._tokens.level -= charge.counted
        if self._output is not None:
            self._output.level -= charge.output
        self._inflight += charge.inflight
        self._admitted[call_id] = (est, charge)
        self._used_calls += 1.0
        self._used_tokens += charge.counted
        self._used_output += charge.output
        self._peak_inflight = max(self._peak_inflight, self._inflight)

    def _drain(self) -> list[str]:
        out: list[str] = []
        calls, tokens, output = self._calls, self._tokens, self._output
        while self._queue:
            _, _, call_id, est, charge, _ = self._queue[0]
            # ``_rate_waits`` inlined: this runs on every request, poll and release
            calls_wait = calls.wait_for(1.0)
            tokens_wait = tokens.wait_for(charge.counted)
            output_wait = 0.0 if output is None else output.wait_for(charge.output)
            if (
                calls_wait > 0.0
                or tokens_wait > 0.0
                or output_wait > 0.0
                or self._inflight_blocks(charge)
            ):
                self._note_hold(calls_wait, tokens_wait, output_wait)
                break
            heapq.heappop(self._queue)
            self._queued_ids.discard(call_id)
            self._admit(call_id, est, charge)
            out.append(call_id)
        return out

    def _note_hold(self, calls: float, tokens: float, output: float) -> None:
        """The head waited on these buckets: a change of order re-ranks the queued calls."""
        if self._order.note_hold(calls, tokens, output):
            self._rerank()

    def _rerank(self) -> None:
        """Rank every queued call again by the current order."""
        priority = self._order.priority
        self._queue = [
            (priority(est, arrived), seq, call_id, est, charge, arrived)
            for _, seq, call_id, est, charge, arrived in self._queue
        ]
        heapq.heapify(self._queue)

    # -- API ---------------------------------------------------------------------------------
    def request(self, call_id: str, estimate: CallEstimate, now: float) -> Admission:
        """Queue a call; admitted now if it reaches the head and fits, else a wait bound."""
        if call_id in self._queued_ids or call_id in self._admitted:
            raise ValueError(f"call {call_id!r} is already queued or in flight")
        self._advance(now)
        self._arrivals += 1
        entry = (
            self._order.priority(estimate, now),
            self._arrivals,
            call_id,
            estimate,
            self._charge(estimate),
            now,
        )
        heapq.heappush(self._queue, entry)
        self._queued_ids.add(call_id)
        admitted = self._drain()
        if call_id in admitted:
            admitted.remove(call_id)
            self._unreported.extend(admitted)
            return Admission(True, 0.0)
        self._unreported.extend(admitted)
        return Admission(False, self._head_wait())

    def _head_wait(self) -> float:
        if not self._queue:
            return 0.0
        return self._wait(self._queue[0][4])

    def poll(self, now: float) -> list[str]:
        """Admit what can go at ``now``; return every call admitted since the last poll
        (except those ``request`` already reported), in admission order."""
        self._advance(now)
        out = self._unreported + self._drain()
        self._unreported = []
        return out

    def next_ready_at(self, now: float) -> float | None:
        """When the head of the queue can go if nothing is released; None if the queue is
        empty, ``inf`` if it waits for in-flight tokens to be released."""
        self._advance(now)
        if not self._queue:
            return None
        return now + self._head_wait()

    def release(self, call_id: str, actual: CallUsage | None, now: float) -> None:
        """Settle an admitted call against its actual usage (None: it failed, refund its
        tokens) and free its in-flight tokens. Call ``poll`` afterwards."""
        self._advance(now)
        entry = self._admitted.pop(call_id, None)
        if entry is None:
            raise KeyError(f"call {call_id!r} is not in flight")
        est, charge = entry
        self._inflight -= charge.inflight
        if actual is None:
            self._tokens.credit(charge.counted)
            self._used_tokens -= charge.counted
            if self._output is not None:
                self._output.credit(charge.output)
            self._used_output -= charge.output
            return
        counted = actual.input_uncached + (actual.input_cached if self.cached_input_counts else 0)
        if self.token_class == "combined":
            counted += actual.output
        self._tokens.settle(charge.counted - counted)
        self._used_tokens -= charge.counted - counted
        if self._output is not None:
            self._output.settle(est.max_output - actual.output)
        self._used_output -= est.max_output - actual.output

    def take_usage(self, now: float) -> PacerUsage:
        """What was admitted since the last ``take_usage`` (or creation), and restart the count.

        ``utilisation`` per budget class: the net admitted rate over the window divided by the
        budget in force now (in-flight: the peak over the window divided by its budget). The
        budget controller grows only budgets that were used (``WindowObservation.utilisation``).
        """
        self._advance(now)
        span = max(now - self._usage_start, 1e-9)
        b = self._budgets
        util = {
            BudgetClass.REQUESTS: self._used_calls / span / b.calls_per_s,
            BudgetClass.TOKENS: max(0.0, self._used_tokens) / span / b.tokens_per_s,
            BudgetClass.INFLIGHT: self._peak_inflight / b.inflight_tokens,
        }
        if b.output_tokens_per_s is not None:
            util[BudgetClass.OUTPUT_TOKENS] = (
                max(0.0, self._used_output) / span / b.output_tokens_per_s
            )
        usage = PacerUsage(
            start=self._usage_start,
            end=now,
            calls=self._used_calls,
            tokens=self._used_tokens,
            output_tokens=self._used_output,
            peak_inflight=self._peak_inflight,
            utilisation=util,
        )
        self._usage_start = now
        self._used_calls = self._used_tokens = self._used_output = 0.0
        self._peak_inflight = float(self._inflight)
        return usage

    def observe_remaining(self, remaining: Mapping[BudgetClass, float], now: float) -> None:
        """The provider stated how much of its buckets is left (rate-limit headers): no bucket
        of ours holds more than that, so a burst the provider can no longer absorb — after its
        limit dropped, or while retries of rejected calls drain it — is not sent. The first
        time a class is stated, its bucket becomes ``stated_burst_s`` deep and as full as the
        provider says (at most that deep; not out of a hold or a debt). After that nothing is
        raised: a reading may be stale, and the provider's refill shows up in later headers
        and in our own refill."""
        self._advance(now)
        for cls, bucket in (
            (BudgetClass.REQUESTS, self._calls),
            (BudgetClass.TOKENS, self._tokens),
            (BudgetClass.OUTPUT_TOKENS, self._output),
        ):
            left = remaining.get(cls)
            if bucket is not None and left is not None and math.isfinite(left):
                if self.stated_burst_s is not None and cls not in self._stated:
                    # the bucket becomes the provider's, mirrored: as deep, and as full as it
                    # says (this once; later readings only lower it, as a stale one may be
                    # fuller). A bucket below empty (a hold after a 429, a call's debt) is not
                    # raised: the provider said it was empty since
                    self._stated.add(cls)
                    bucket.capacity = (
                        self._calls_capacity(bucket.rate)
                        if cls is BudgetClass.REQUESTS
                        else bucket.rate * self.stated_burst_s
                    )
                    if bucket.level >= 0.0:
                        bucket.level = max(bucket.level, min(bucket.capacity, left))
                bucket.level = min(bucket.level, max(left, 0.0))

    def hold(self, classes: Collection[BudgetClass], seconds: float, now: float) -> None:
        """Send nothing on ``classes`` for ``seconds`` of their refill: a provider that rejected
        a call and says nothing of its buckets has an empty one, and calls (retries first)
        sent into it at once are rejected too; the held time lets it refill."""
        self._advance(now)
        for cls, bucket in (
            (BudgetClass.REQUESTS, self._calls),
            (BudgetClass.TOKENS, self._tokens),
            (BudgetClass.OUTPUT_TOKENS, self._output),
        ):
            if bucket is not None and cls in classes:
                bucket.level = min(bucket.level, -bucket.rate * seconds)

    def cancel(self, call_id: str, now: float) -> bool:
        """Drop a queued call (client gone). Returns False if it was not queued."""
        self._advance(now)
        if call_id not in self._queued_ids:
            return False
        self._queue = [item for item in self._queue if item[2] != call_id]
        heapq.heapify(self._queue)
        self._queued_ids.discard(call_id)
        return True

    @property
    def old_tasks_first(self) -> bool:
        return self._order.old_tasks_first

    def set_old_tasks_first(self, on: bool) -> None:
        """Planner update: whether an old task's call goes first while the output bucket
        holds the queue back (``planner.pacer_order``); the queued calls are re-ranked."""
        if on != self._order.old_tasks_first:
            self._order.old_tasks_first = on
            self._rerank()

    def set_budgets(self, budgets: Budgets, now: float) -> None:
        """Planner update: new rates and capacities from ``now``; levels clipped, nothing
        in flight is revoked."""
        self._advance(now)
        self._budgets = budgets
        self._calls.retune(budgets.calls_per_s, self._calls_capacity(budgets.calls_per_s))
        tokens_depth = self._depth(BudgetClass.TOKENS)
        self._tokens.retune(budgets.tokens_per_s, budgets.tokens_per_s * tokens_depth)
        output_depth = self._depth(BudgetClass.OUTPUT_TOKENS)
        if budgets.output_tokens_per_s is None:
            self._output = None
        elif self._output is None:
            self._output = _Bucket(
                budgets.output_tokens_per_s, budgets.output_tokens_per_s * output_depth
            )
        else:
            self._output.retune(
                budgets.output_tokens_per_s,
                budgets.output_tokens_per_s * output_depth,
            )
        self._inflight_budget = budgets.inflight_tokens
