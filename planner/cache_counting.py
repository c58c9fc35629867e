"""Whether the provider counts cache reads against its token limit, from what its headers say.

The alias config states a belief (``cached_input_counts``); it is the operator's, and it can be
wrong. Wrong one way (the provider counts cache reads, the pacer does not), every call costs the
provider several times what the pacer charged: a 429 storm. Wrong the other way, the pacer
charges cache reads against a limit that ignores them, and the run goes at a fraction of what
the provider allows, with no 429 to say so.

A provider that states a token limit ``L`` and what remains of it ``R`` (a per-minute bucket,
refilled continuously at ``L``) says how much it charged between two observations:
``charge <= L x dt + R_start - R_end``, with equality when its bucket stayed below capacity (no
refill was lost). Comparing that with what was sent in the same span, split into what counts
either way (uncached input, and output for a combined limit) and cache reads, tells which
belief explains the provider:

* **cache reads count** when the provider charged at least the base plus half the cache reads,
  and clearly more than the base alone. What it charged is at least what left its bucket
  (``R_start - R_end``), and exactly the bound when the bucket stayed below capacity. A bucket
  drained from full by calls whose uncached part is a fraction of it says so at once, at the
  first 429, before a storm;
* **cache reads do not count** when, over any spans, more was sent than the provider can have
  charged (the bound) by a clear share of the cache reads.

Evidence needs volume (a share of the bucket) and cache reads that matter (a share of the base);
otherwise the belief stands.

Where the pacer sends at the stated limit in the units of a belief that cache reads count, and
the provider does not count them, the bucket stays nearly full: refill is lost at both ends of
every span, and the bound cannot fall below what was sent. The calls sent just before a reading
still say it (``dip_window``): a bucket holds at most its capacity, so what the provider charged
over the last ``t`` seconds before a reading is at most ``L x t + capacity - R``. A call of 8% of
the bucket counted, sent a second before a reading that finds the bucket 97% full, was not
charged its cache reads (wide-1928 of ``sim.generate_wide``: 83% of its input cached, the pacer
at the stated limit in counted units, a run at a third of the provider's speed with no 429 to
correct it). Such a dip needs no volume, only an excess that is a clear share of the bucket, and
is taken as evidence when ``min_dips`` readings say it.

A 429 of the counted class states its bucket empty at the moment its attempt arrived. With a
reading of the same limit shortly before (``throttle_window``), what the calls sent between them
were charged follows at once, at the first 429 of a storm, not a span's close later: a provider
that counts the cache reads the pacer does not charge empties its bucket with the uncached part
a fraction of it. A call whose send is not known (a retry's last attempt went out after waits
the ledger does not keep) is counted as sent in the span: that over-states what was sent, which
only makes "cache reads count" harder to conclude (in a storm, the retries keep it from being
concluded at all; at its first 429 they are few).

What was sent in a span is known only once its calls have been answered (the gateway records a
call at its response). A span closed while calls sent in it were still in flight under-states
what was sent, and the provider seems to have charged more than the base: "cache reads count",
wrongly, and the pacer then charges cache reads against a limit that ignores them (a run at
half speed with no 429 to correct it: wide-62 of ``sim.generate_wide``, whose calls took up to a
minute against a 15 s lag). So a span closes once no call requested in it is still in flight,
as the gateway states it (``tasks.plan_counting``); where it does not, ``span_close_lag_s``
after its end: a fixed lag plus the longest latency seen recently.
Pure: windows in, a belief out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from evalfleet.errors import ConfigError

__all__ = [
    "RETRY_LOOKBACK_S",
    "STORM_GAP_S",
    "THROTTLE_SPAN_S",
    "BucketReading",
    "ChargeWindow",
    "CountingConfig",
    "dip_window",
    "infer_cached_input_counts",
    "span_close_lag_s",
    "throttle_window",
]

LATENCY_LOOKBACK_S = 600.0  # the latencies that set a span's closing lag: answered this recently
MAX_CLOSE_LAG_S = 900.0  # a span waits at most this long for its calls' answers
# a 429 is judged against a reading at most this long before it: over a longer span the refill
# a bucket below capacity lost is unknown, and the bound says less
THROTTLE_SPAN_S = 30.0
# served retries requested this long before a 429 count as sent in its span (and the calls sent
# in it are looked for among those requested as long before: a pacer wait)
RETRY_LOOKBACK_S = LATENCY_LOOKBACK_S
# a storm's first token 429 is the one judged: a later one replaces it only this long after the
# storm's last (the calls sent before a 429 are all recorded only after the next 429 of a storm)
STORM_GAP_S = 60.0


def span_close_lag_s(base_lag_s: float, longest_recent_latency_s: float | None) -> float:
    """How long after its end a span of sent calls may close: ``base_lag_s`` (the recorder's
    flush, the tick) plus the longest latency (send to answer) of the calls answered over the
    last ``LATENCY_LOOKBACK_S``, at most ``MAX_CLOSE_LAG_S``. A call sent just before the end
    of a span is then answered, and counted, before the span is compared with the provider's
    bucket (module docstring)."""
    longest = max(0.0, longest_recent_latency_s or 0.0)
    return min(base_lag_s + longest, MAX_CLOSE_LAG_S)


@dataclass(frozen=True, slots=True)
class BucketReading:
    """The provider's counted token bucket as stated at ``at`` (seconds): its limit per second
    and what remained of it. ``charged_through``: every call sent before it had been charged in
    ``remaining`` (a header states the bucket as of some moment between the answered call's
    send and its answer: that send; None: ``at``, as a simulated provider read at once)."""

    at: float
    limit_per_s: float
    remaining: float
    charged_through: float | None = None


@dataclass(frozen=True, slots=True)
class ChargeWindow:
    """One span between two observations of the provider's counted token bucket.

    ``limit_per_s``: its stated limit per second (the same at both ends); ``capacity``: the
    bucket's size (a per-minute limit: 60 x ``limit_per_s``); ``remaining_*``: what it said was
    left; ``base``: tokens sent in the span that count either way; ``cached``: cache reads sent.
    """

    span_s: float
    limit_per_s: float
    capacity: float
    remaining_start: float
    remaining_end: float
    base: float
    cached: float

    @classmethod
    def between(
        cls, start: BucketReading, end_at: float, end_remaining: float, base: float, cached: float
    ) -> ChargeWindow:
        """The span from ``start`` to a reading of the same stated limit at ``end_at``, with a
        per-minute bucket (capacity 60 x the limit)."""
        return cls(
            span_s=max(end_at - start.at, 1e-9),
            limit_per_s=start.limit_per_s,
            capacity=start.limit_per_s * 60.0,
            remaining_start=start.remaining,
            remaining_end=end_remaining,
            base=base,
            cached=cached,
        )

    @property
    def charge_bound(self) -> float:
        """The most the provider can have charged over the span."""
        return self.limit_per_s * self.span_s + self.remaining_start - self.remaining_end

    def charge_floor(self, share: float) -> float:
        """The least the provider can have charged: what left its bucket, plus the refill when
        the bucket stayed below capacity (``below_capacity``)."""
        if self.below_capacity(share):
            return self.charge_bound
        return max(self.remaining_start - self.remaining_end, 0.0)

    def below_capacity(self, share: float) -> bool:
        """Both ends below ``share`` x capacity: no refill was lost, the bound is the charge."""
        top = share * self.capacity
        return self.remaining_start < top and self.remaining_end < top


@dataclass(frozen=True)
class CountingConfig:
    """Constants of the inference; each default is bounded (``ConfigError`` names the field)."""

    full_share: float = 0.9  # a bucket above this share of capacity may have lost refill [0.5, 1]
    min_volume: float = 0.5  # evidence needs this many buckets' worth sent [0.1, 10]
    # cache reads below this share of the base do not matter [0, 10]. 0.05, not 0.25: a pacer
    # not charging cache reads of 19% of the base against a limit that counts them sends 19%
    # over it, and a stated limit is re-probed each time its 429 memory lapses (wide-2609: 643
    # 429s over a 52-hour run, rate 0.58%; 1 once flipped). Not 0.1 either (until the
    # forty-sixth round): at 9.9% (wide-3791) the pacer, held at the stated limit, drew a 429
    # each time its bucket ran down, every ~260 s, rate 0.62%; the charge must still exceed the
    # base by this share, and of 2,352 generated runs no other flips (docs/bench-planner.md)
    min_cached_share: float = 0.05
    # the same where the evidence is that they do not count (sent over the bound): a pacer
    # charging cache reads of 19% of the base against a limit that ignores them runs 16% under
    # it (wide-77), and an over-send is measured, not inferred from a drained bucket [0, 10]
    min_cached_share_excess: float = 0.1
    counts_share: float = 0.5  # charged at least base + this x cache reads: they count [0.1, 0.9]
    excess_share: float = 0.3  # sent over the bound by this x cache reads: they don't [0.1, 0.9]
    # a dip (``dip_window``) says cache reads do not count when sent over its bound by this
    # share of the bucket as well [0.005, 0.5], on this many readings of the last spans [1, 8]
    dip_share: float = 0.02
    min_dips: int = 2

    def __post_init__(self) -> None:
        problems: list[str] = []
        for name, lo, hi in (
            ("full_share", 0.5, 1.0),
            ("min_volume", 0.1, 10.0),
            ("min_cached_share", 0.0, 10.0),
            ("min_cached_share_excess", 0.0, 10.0),
            ("counts_share", 0.1, 0.9),
            ("excess_share", 0.1, 0.9),
            ("dip_share", 0.005, 0.5),
            ("min_dips", 1, 8),
        ):
            value = getattr(self, name)
            if not (math.isfinite(value) and lo <= value <= hi):
                problems.append(f"{name}: must be within [{lo}, {hi}], got {value!r}")
        if problems:
            raise ConfigError("cache-counting config", problems)


def throttle_window(
    start: BucketReading,
    throttled: BucketReading,
    sent: Sequence[tuple[float, float, float]],
    unplaced: tuple[float, float] = (0.0, 0.0),
) -> ChargeWindow | None:
    """The span from ``start`` to a 429's reading of the same bucket (``throttled``: charged
    through its attempt's send, when the bucket was found short). ``sent``: (sent at, base,
    cache reads) of the accepted calls, over any look-back; ``unplaced``: (base, cache reads)
    of accepted calls that may have been sent in the span, counted as if they were. Every
    choice errs towards "cache reads do not count": the span starts at ``start.at`` (its
    bucket as late as it can have been read: the least refill) and takes every call sent from
    ``start.charged_through`` on (some may already be in its remaining). None when the limits
    differ or the 429 is not after it."""
    end = throttled.at if throttled.charged_through is None else throttled.charged_through
    if start.limit_per_s != throttled.limit_per_s or start.limit_per_s <= 0 or end <= start.at:
        return None
    first = start.at if start.charged_through is None else start.charged_through
    inside = [(b, c) for at, b, c in sent if first <= at < end]
    base = sum(b for b, _ in inside) + unplaced[0]
    cached = sum(c for _, c in inside) + unplaced[1]
    return ChargeWindow.between(start, end, throttled.remaining, base, cached)


def dip_window(
    reading: BucketReading,
    sent: Sequence[tuple[float, float, float]],
    config: CountingConfig | None = None,
) -> ChargeWindow | None:
    """The span before ``reading`` that says most against "cache reads count", its bucket taken
    as full at the start (module docstring). ``sent``: (sent at, base, cache reads) of the
    accepted calls sent, over any look-back (those sent after ``reading.charged_through`` may
    not be in its ``remaining`` and are left out); None when none is left."""
    cfg = config or CountingConfig()
    if reading.limit_per_s <= 0:
        return None
    through = reading.at if reading.charged_through is None else reading.charged_through
    best: ChargeWindow | None = None
    best_score = -math.inf
    base = cached = 0.0
    for at, call_base, call_cached in sorted(sent, key=lambda s: s[0], reverse=True):
        if at >= through:
            continue
        base += call_base
        cached += call_cached
        span_s = max(reading.at - at, 1e-9)
        score = base + (1.0 - cfg.excess_share) * cached - reading.limit_per_s * span_s
        if score > best_score:
            best_score = score
            best = ChargeWindow(
                span_s=span_s,
                limit_per_s=reading.limit_per_s,
                capacity=reading.limit_per_s * 60.0,
                remaining_start=reading.limit_per_s * 60.0,
                remaining_end=reading.remaining,
                base=base,
                cached=cached,
            )
    return best


def infer_cached_input_counts(
    windows: Sequence[ChargeWindow],
    believed: bool,
    config: CountingConfig | None = None,
    dips: Sequence[ChargeWindow] = (),
) -> bool:
    """The belief the windows (and the ``dip_window`` of their readings) support: ``believed``
    unless they clearly contradict it."""
    cfg = config or CountingConfig()
    if believed and sum(_dip_over_bound(w, cfg) for w in dips) >= cfg.min_dips:
        return False
    usable = [w for w in windows if w.limit_per_s > 0 and w.capacity > 0 and w.span_s > 0]
    if not usable:
        return believed
    capacity = max(w.capacity for w in usable)
    if believed:
        return not any(_sent_over_bound(run, capacity, cfg) for run in _runs(usable))
    base = sum(w.base for w in usable)
    cached = sum(w.cached for w in usable)
    charged = sum(w.charge_floor(cfg.full_share) for w in usable)
    if (
        _matters(base, cached, capacity, cfg, cfg.min_cached_share)
        and charged >= base + cfg.counts_share * cached
        and charged > base * (1.0 + cfg.min_cached_share)
    ):
        return True
    return believed


def _runs(windows: Sequence[ChargeWindow]) -> list[Sequence[ChargeWindow]]:
    """Every run of consecutive windows, the longest first."""
    n = len(windows)
    return [windows[i : i + k] for k in range(n, 0, -1) for i in range(n - k + 1)]


def _sent_over_bound(run: Sequence[ChargeWindow], capacity: float, cfg: CountingConfig) -> bool:
    """More was sent over ``run`` than the provider can have charged, by a clear share of the
    cache reads: they do not count."""
    base = sum(w.base for w in run)
    cached = sum(w.cached for w in run)
    bound = sum(w.charge_bound for w in run)
    return (
        _matters(base, cached, capacity, cfg, cfg.min_cached_share_excess)
        and base + cached > bound + cfg.excess_share * cached
    )


def _dip_over_bound(window: ChargeWindow, cfg: CountingConfig) -> bool:
    """A dip sent over its bound by a clear share of its cache reads and of the bucket."""
    if window.limit_per_s <= 0 or window.capacity <= 0:
        return False
    over = window.base + window.cached - window.charge_bound
    return (
        window.cached >= cfg.min_cached_share_excess * window.base
        and over > cfg.excess_share * window.cached
        and over >= cfg.dip_share * window.capacity
    )


def _matters(
    base: float, cached: float, capacity: float, cfg: CountingConfig, min_cached_share: float
) -> bool:
    return base + cached >= cfg.min_volume * capacity and cached >= min_cached_share * base
