"""The provider's true rate limits: token buckets per limit class, time passed in.

Used by the discrete-event simulator and by the simulated provider HTTP server, so that both
enforce the same limits the same way. It owns what a provider does with an incoming request:
admit it (charging its buckets) or reject it naming the limit that was hit and a retry-after.

Model (per-minute limits, as providers state them):
- One bucket per configured class: ``requests`` (rpm), ``tokens`` (combined input + output,
  OpenAI style, tpm), ``input_tokens`` (input_tpm) and ``output_tokens`` (output_tpm, Anthropic
  style). A bucket holds at most ``limit`` (one minute's worth) and refills continuously at
  ``limit / 60`` per second. Buckets start full.
- Counted input = uncached input, plus cached input when ``cached_input_counts``.
- A request is admitted when every bucket holds what it needs: 1 request; counted input
  (input class); counted input + ``max_output`` (combined class); ``max_output`` (output
  class). Output tokens are charged on admission from the request's ``max_tokens`` and the
  unused part is refunded when the call is settled with its actual output (as Anthropic
  documents for OTPM, and as OpenAI estimates with ``max_tokens``).
- A rejected request still consumes one request from the request bucket (OpenAI documents
  that unsuccessful requests count against the per-minute limit). The request bucket is
  floored at 0: rejections destroy refill progress but do not build up unbounded debt.
- A request that needs more than a bucket's capacity can never be admitted: it is rejected
  with ``too_large=True`` ("Request too large").
- ``changes`` set new limits at given times (None fields: unchanged). On a drop the level is
  clipped to the new capacity; on a rise the level is kept (the extra room refills).
- Rejection: the limit hit is the failing class with the longest wait; ``retry_after_s`` is
  the time (after the rejection's own request charge) until every bucket holds what the
  request needs, so a client that honours it is admitted if nobody else got there first.

Deterministic; time (seconds, any origin, non-decreasing) is always an argument. A time
earlier than the last one seen is treated as the last one (no refill, no error).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from planner.classify import LimitType

__all__ = [
    "CLASS_ORDER",
    "CallCharge",
    "ClassSnapshot",
    "LimitChange",
    "LimitSpec",
    "LimitsSnapshot",
    "ProviderAdmission",
    "ProviderLimits",
    "Ticket",
    "limit_schedule",
    "time_to_serve",
]

# Order used for ties and for iteration everywhere.
CLASS_ORDER: tuple[LimitType, ...] = (
    LimitType.REQUESTS,
    LimitType.INPUT_TOKENS,
    LimitType.TOKENS,
    LimitType.OUTPUT_TOKENS,
)
_FIELD = {
    LimitType.REQUESTS: "rpm",
    LimitType.TOKENS: "tpm",
    LimitType.INPUT_TOKENS: "input_tpm",
    LimitType.OUTPUT_TOKENS: "output_tpm",
}


def _check_limit(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be a positive per-minute limit, got {value!r}")


@dataclass(frozen=True)
class LimitSpec:
    """True per-minute limits of a provider (None: no such limit)."""

    rpm: float | None = None
    tpm: float | None = None
    input_tpm: float | None = None
    output_tpm: float | None = None
    cached_input_counts: bool = False

    def __post_init__(self) -> None:
        for cls, name in _FIELD.items():
            _check_limit(name, self.limit(cls))
        if all(self.limit(c) is None for c in CLASS_ORDER):
            raise ValueError(
                "a provider needs at least one limit (rpm, tpm, input_tpm, output_tpm)"
            )

    def limit(self, cls: LimitType) -> float | None:
        """The per-minute limit of a class (None: not limited)."""
        value: float | None = getattr(self, _FIELD[cls])
        return value


@dataclass(frozen=True)
class LimitChange:
    """New per-minute limits from ``at_s`` on; None fields are left unchanged."""

    at_s: float
    rpm: float | None = None
    tpm: float | None = None
    input_tpm: float | None = None
    output_tpm: float | None = None

    def __post_init__(self) -> None:
        for name in _FIELD.values():
            _check_limit(f"changes[at_s={self.at_s}].{name}", getattr(self, name))

    def limit(self, cls: LimitType) -> float | None:
        value: float | None = getattr(self, _FIELD[cls])
        return value


@dataclass(frozen=True)
class CallCharge:
    """What one request asks of the provider: input split by cache, and its max_tokens."""

    input_uncached: int
    input_cached: int = 0
    max_output: int = 0

    def __post_init__(self) -> None:
        if self.input_uncached < 0 or self.input_cached < 0 or self.max_output < 0:
            raise ValueError(f"token counts must be >= 0: {self}")


@dataclass(frozen=True)
class Ticket:
    """What an admitted request was charged, per class; hand it back to ``settle``."""

    charged: Mapping[LimitType, float]
    max_output: int


@dataclass(frozen=True)
class ProviderAdmission:
    """Admitted (with a ticket) or rejected (the limit hit and the retry-after)."""

    admitted: bool
    ticket: Ticket | None = None
    limit: LimitType | None = None
    retry_after_s: float = 0.0
    too_large: bool = False
    requested: float = 0.0  # what the request needed from the limit that was hit


@dataclass(frozen=True)
class ClassSnapshot:
    """One class for headers: per-minute limit, whole units remaining, seconds until full."""

    limit: float
    remaining: float
    reset_s: float


@dataclass(frozen=True)
class LimitsSnapshot:
    at_s: float
    classes: Mapping[LimitType, ClassSnapshot] = field(default_factory=dict)
    cached_input_counts: bool = False


_EPS = 1e-9
# what a request needs from a class's bucket: one request, counted input, counted input plus
# max_output, or max_output
_REQUEST, _INPUT, _COMBINED, _OUTPUT = range(4)
_NEED_KIND = {
    LimitType.REQUESTS: _REQUEST,
    LimitType.INPUT_TOKENS: _INPUT,
    LimitType.TOKENS: _COMBINED,
    LimitType.OUTPUT_TOKENS: _OUTPUT,
}


class _Bucket:
    __slots__ = ("level", "limit")

    def __init__(self, limit: float) -> None:
        self.limit = limit
        self.level = limit

    @property
    def rate(self) -> float:
        return self.limit / 60.0

    def wait_for(self, need: float) -> float:
        short = need - self.level
        if short <= 0.0 or short <= _EPS * (need if need > 1.0 else 1.0):
            return 0.0  # fits, or short by float dust from refill arithmetic
        return short / self.rate


def _longest_wait(
    needs: list[tuple[LimitType, _Bucket, float]],
) -> tuple[LimitType | None, float, float]:
    """The class short longest (the first in CLASS_ORDER among equals; None: every need
    fits), what it needs, and how long until it fits. Called for every request of a 429
    storm, so ``_Bucket.wait_for`` is inlined."""
    hit: LimitType | None = None
    hit_need = 0.0
    worst = 0.0
    for cls, b, n in needs:
        short = n - b.level
        if short > 0.0 and short > _EPS * (n if n > 1.0 else 1.0):
            wait = short / (b.limit / 60.0)
            if wait > worst:
                hit, hit_need, worst = cls, n, wait
    return hit, hit_need, worst


class ProviderLimits:
    """The live bucket state of one provider (or one provider key)."""

    def __init__(
        self, spec: LimitSpec, changes: Iterable[LimitChange] = (), start_s: float = 0.0
    ) -> None:
        self.spec = spec
        self._changes = sorted(changes, key=lambda c: c.at_s)
        self._next_change = 0
        self._now = start_s
        self._buckets: dict[LimitType, _Bucket] = {}
        for cls in CLASS_ORDER:
            lim = spec.limit(cls)
            if lim is not None:
                self._buckets[cls] = _Bucket(lim)
        self.consumed: dict[LimitType, float] = {c: 0.0 for c in self._buckets}
        self._index_buckets()
        self.admitted_count = 0
        self.rejected_count = 0
        self._advance(start_s)

    def _index_buckets(self) -> None:
        # the configured buckets in CLASS_ORDER, as a list: admit walks it for every request
        self._buckets = {c: self._buckets[c] for c in CLASS_ORDER if c in self._buckets}
        self._bucket_list = list(self._buckets.values())
        self._classes = [(c, b, _NEED_KIND[c]) for c, b in self._buckets.items()]
        self._request_bucket = self._buckets.get(LimitType.REQUESTS)

    # -- time -------------------------------------------------------------------------------
    def _advance(self, now: float) -> None:
        changes = self._changes
        if self._next_change < len(changes) and changes[self._next_change].at_s <= now:
            self._advance_through_changes(now)
        elif now > self._now:
            self._refill_all(now - self._now)
            self._now = now

    def _advance_through_changes(self, now: float) -> None:
        if now <= self._now:
            self._apply_due_changes()
            return
        while (
            self._next_change < len(self._changes) and self._changes[self._next_change].at_s <= now
        ):
            change = self._changes[self._next_change]
            if change.at_s > self._now:
                self._refill_all(change.at_s - self._now)
                self._now = change.at_s
            self._apply(change)
            self._next_change += 1
        self._refill_all(now - self._now)
        self._now = now

    def _apply_due_changes(self) -> None:
        while (
            self._next_change < len(self._changes)
            and self._changes[self._next_change].at_s <= self._now
        ):
            self._apply(self._changes[self._next_change])
            self._next_change += 1

    def _refill_all(self, dt: float) -> None:
        # on every request of a 429 storm: the list, and the refill inlined
        if dt <= 0:
            return
        for b in self._bucket_list:
            level = b.level + dt * b.limit / 60.0
            b.level = level if level < b.limit else b.limit

    def _apply(self, change: LimitChange) -> None:
        for cls in CLASS_ORDER:
            new = change.limit(cls)
            if new is None:
                continue
            bucket = self._buckets.get(cls)
            if bucket is None:
                self._buckets[cls] = _Bucket(new)
                self.consumed.setdefault(cls, 0.0)
                self._index_buckets()
            else:
                bucket.limit = new
                bucket.level = min(bucket.level, new)

    # -- queries ----------------------------------------------------------------------------
    @property
    def now(self) -> float:
        return self._now

    def limit_now(self, cls: LimitType) -> float | None:
        """The per-minute limit of a class in effect at the last time seen."""
        b = self._buckets.get(cls)
        return None if b is None else b.limit

    def counted_input(self, charge: CallCharge) -> int:
        cached = charge.input_cached if self.spec.cached_input_counts else 0
        return charge.input_uncached + cached

    def needs(self, charge: CallCharge) -> dict[LimitType, float]:
        """What a request needs from each configured bucket."""
        return {cls: need for cls, _, need in self._needs(charge)}

    def _needs(self, charge: CallCharge) -> list[tuple[LimitType, _Bucket, float]]:
        counted = self.counted_input(charge)
        out = charge.max_output
        by_kind = (1.0, float(counted), float(counted + out), float(out))
        return [(cls, b, by_kind[kind]) for cls, b, kind in self._classes]

    # -- admission --------------------------------------------------------------------------
    def admit(self, now: float, charge: CallCharge) -> ProviderAdmission:
        """Admit the request at ``now`` (charging every bucket) or reject it."""
        self._advance(now)
        needs = self._needs(charge)
        for cls, b, n in needs:
            if n > b.limit:
                self._count_rejection()
                return ProviderAdmission(
                    admitted=False,
                    limit=cls,
                    retry_after_s=b.wait_for(b.limit),
                    too_large=True,
                    requested=n,
                )
        hit, hit_need, _ = _longest_wait(needs)
        if hit is not None:
            self._count_rejection()
            # the rejection itself consumed a request: wait until everything fits again
            _, _, after = _longest_wait(needs)
            return ProviderAdmission(
                admitted=False, limit=hit, retry_after_s=after, requested=hit_need
            )
        consumed = self.consumed
        charged: dict[LimitType, float] = {}
        for cls, b, n in needs:
            b.level -= n
            consumed[cls] += n
            charged[cls] = n
        self.admitted_count += 1
        return ProviderAdmission(
            admitted=True, ticket=Ticket(charged=charged, max_output=charge.max_output)
        )

    def _count_rejection(self) -> None:
        self.rejected_count += 1
        req = self._request_bucket
        if req is not None:
            level = req.level - 1.0
            req.level = level if level > 0.0 else 0.0
            self.consumed[LimitType.REQUESTS] += 1.0

    def settle(self, now: float, ticket: Ticket, actual_output: int) -> None:
        """Refund the unused part of the ``max_output`` charge once the call has finished."""
        self._advance(now)
        unused = max(0, ticket.max_output - max(0, actual_output))
        if unused == 0:
            return
        for cls in (LimitType.TOKENS, LimitType.OUTPUT_TOKENS):
            if cls in ticket.charged and cls in self._buckets:
                b = self._buckets[cls]
                b.level = min(b.limit, b.level + unused)
                self.consumed[cls] -= unused

    # -- headers ----------------------------------------------------------------------------
    def snapshot(self, now: float) -> LimitsSnapshot:
        """Limits, remaining (whole units, >= 0) and seconds until full, per class."""
        self._advance(now)
        classes = {
            c: ClassSnapshot(
                limit=b.limit,
                remaining=float(max(0, int(b.level))),
                reset_s=b.wait_for(b.limit),
            )
            for c, b in self._buckets.items()
        }
        return LimitsSnapshot(
            at_s=self._now, classes=classes, cached_input_counts=self.spec.cached_input_counts
        )


def limit_schedule(
    spec: LimitSpec, changes: Iterable[LimitChange], cls: LimitType
) -> list[tuple[float, float | None]]:
    """The per-minute limit of ``cls`` as (from_s, limit) steps, starting at time 0."""
    steps: list[tuple[float, float | None]] = [(0.0, spec.limit(cls))]
    for ch in sorted(changes, key=lambda c: c.at_s):
        new = ch.limit(cls)
        if new is not None:
            if ch.at_s <= 0:
                steps[0] = (0.0, new)
            else:
                steps.append((ch.at_s, new))
    return steps


def time_to_serve(
    spec: LimitSpec, changes: Iterable[LimitChange], cls: LimitType, amount: float
) -> float:
    """Earliest T with ∫0..T limit(t)/60 dt >= amount: a lower bound on serving ``amount``.

    Returns 0 for no demand and for an unlimited class (it never binds).
    """
    if amount <= 0:
        return 0.0
    steps = limit_schedule(spec, changes, cls)
    remaining = amount
    for i, (start, lim) in enumerate(steps):
        end = steps[i + 1][0] if i + 1 < len(steps) else float("inf")
        if lim is None:
            return 0.0
        rate = lim / 60.0
        span = end - start
        if remaining <= rate * span:
            return start + remaining / rate
        remaining -= rate * span
    return float("inf")
