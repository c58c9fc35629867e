"""Properties of the simulated provider's limits (``sim.limits.ProviderLimits``), the judge of
every benchmark figure, over drawn limits, limit changes and request streams:

- over any interval, what it admits of each class stays within the bucket (the per-minute limit
  in effect at the interval's start) plus the limit's refill over the interval, through drops
  and rises of the limit, a request at the very moment of a drop included: no policy can beat
  a limit the simulator enforces loosely;
- a request needing more than a bucket holds is refused as too large, and only such a request;
- a client that honours a 429's ``retry_after_s`` is admitted then, if nobody else came first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hypothesis import given
from hypothesis import strategies as st

from planner.classify import LimitType
from sim.limits import (
    CLASS_ORDER,
    CallCharge,
    LimitChange,
    LimitSpec,
    ProviderLimits,
    limit_schedule,
)
from tests.property_support import PROPERTIES, log_uniform

SLACK = 1e-6
_FIELD = {
    LimitType.REQUESTS: "rpm",
    LimitType.TOKENS: "tpm",
    LimitType.INPUT_TOKENS: "input_tpm",
    LimitType.OUTPUT_TOKENS: "output_tpm",
}
_RANGE = {
    LimitType.REQUESTS: (6.0, 600.0),
    LimitType.TOKENS: (2e5, 1e7),
    LimitType.INPUT_TOKENS: (2e5, 1e7),
    LimitType.OUTPUT_TOKENS: (1e4, 1e6),
}


def _per_minute(cls: LimitType) -> st.SearchStrategy[float]:
    return log_uniform(*_RANGE[cls])


def _charge() -> st.SearchStrategy[CallCharge]:
    return st.builds(
        CallCharge,
        input_uncached=st.integers(0, 60_000),
        input_cached=st.integers(0, 150_000),
        max_output=st.integers(0, 8_000),
    )


@dataclass(frozen=True)
class Case:
    spec: LimitSpec
    changes: tuple[LimitChange, ...]
    requests: tuple[tuple[float, CallCharge], ...]  # (time, charge), in time order


@st.composite
def _case(draw: st.DrawFn) -> Case:
    classes = draw(st.sets(st.sampled_from(CLASS_ORDER), min_size=1))
    spec = LimitSpec(
        **{_FIELD[c]: draw(_per_minute(c)) for c in classes},
        cached_input_counts=draw(st.booleans()),
    )
    changes: list[LimitChange] = []
    for _ in range(draw(st.integers(0, 3))):
        moved = draw(st.sets(st.sampled_from(sorted(classes)), min_size=1))
        changes.append(
            LimitChange(
                at_s=draw(st.floats(1.0, 600.0)),
                **{_FIELD[c]: draw(_per_minute(c)) for c in moved},
            )
        )
    requests, now = [], 0.0
    # enough requests, close enough together, to hold some limit at its refill for minutes
    for _ in range(draw(st.integers(20, 150))):
        now += draw(st.sampled_from((0.0, 0.05, 0.5)) | st.floats(0.0, 4.0))
        charge = draw(_charge())
        requests.append((now, charge))
    # a request at the very moment of a change meets the new limits before any refill could
    # hide a level the change left above them
    for change in changes:
        if draw(st.booleans()):
            requests.append((change.at_s, draw(_charge())))
    requests.sort(key=lambda r: r[0])
    return Case(spec, tuple(sorted(changes, key=lambda c: c.at_s)), tuple(requests))


def _limit_at(case: Case, cls: LimitType, t: float) -> float:
    """The limit in effect at ``t``: a change at ``t`` is in effect for a request at ``t``."""
    steps = limit_schedule(case.spec, case.changes, cls)
    return [lim for start, lim in steps if start <= t][-1] or 0.0


def _refill(case: Case, cls: LimitType, a: float, b: float) -> float:
    """∫a..b limit(t)/60 dt."""
    steps = limit_schedule(case.spec, case.changes, cls)
    total = 0.0
    for i, (start, lim) in enumerate(steps):
        end = steps[i + 1][0] if i + 1 < len(steps) else math.inf
        lo, hi = max(start, a), min(end, b)
        if lim is not None and hi > lo:
            total += (hi - lo) * lim / 60.0
    return total


def _assert_within_limits(case: Case, admitted: list[tuple[float, dict[LimitType, float]]]) -> None:
    """Every interval between two admissions holds at most the bucket then plus the refill."""
    for cls in ProviderLimits(case.spec).needs(CallCharge(0)):
        for i, (first, _) in enumerate(admitted):
            total = 0.0
            for last, needs in admitted[i:]:
                total += needs[cls]
                allowed = _limit_at(case, cls, first) + _refill(case, cls, first, last)
                assert total <= allowed * (1 + SLACK) + SLACK, (
                    f"{cls}: {total:.6g} admitted from {first:.6g} s to {last:.6g} s, "
                    f"over {allowed:.6g}"
                )


@PROPERTIES
@given(_case())
def test_what_the_provider_admits_stays_within_each_limit_over_any_interval(case: Case) -> None:
    """A stream that ignores the 429s (their rejections drain the request bucket)."""
    provider = ProviderLimits(case.spec, case.changes)
    admitted: list[tuple[float, dict[LimitType, float]]] = []
    for now, charge in case.requests:
        needs = provider.needs(charge)
        adm = provider.admit(now, charge)
        too_large = [c for c, n in needs.items() if n > (provider.limit_now(c) or math.inf)]
        assert adm.too_large == bool(too_large), (now, needs, adm)
        if adm.admitted:
            assert adm.ticket is not None
            assert dict(adm.ticket.charged) == needs
            admitted.append((now, needs))
    _assert_within_limits(case, admitted)


@PROPERTIES
@given(_case())
def test_a_client_that_honours_retry_after_is_admitted_then(case: Case) -> None:
    """One client alone, each request sent when the last is admitted or when its 429 says: it
    is admitted then (unless a limit changed meanwhile), and so kept at a limit's refill it
    still stays within every limit, through its changes."""
    provider = ProviderLimits(case.spec, case.changes)
    admitted: list[tuple[float, dict[LimitType, float]]] = []
    now, sent_at = 0.0, 0.0
    for arrives_at, charge in case.requests:
        # the stream's own gaps, after whatever the client waited for its last 429
        now += arrives_at - sent_at
        sent_at = arrives_at
        adm = provider.admit(now, charge)
        if not adm.admitted and not adm.too_large:
            assert adm.retry_after_s > 0 and math.isfinite(adm.retry_after_s), adm
            changed = any(now < c.at_s <= now + adm.retry_after_s for c in case.changes)
            now += adm.retry_after_s
            retried = provider.admit(now, charge)
            assert retried.admitted or changed, (
                f"a retry {adm.retry_after_s:.6g} s after a 429 of {adm.limit} was refused "
                f"by {retried.limit}"
            )
            adm = retried
        if adm.admitted:
            admitted.append((now, provider.needs(charge)))
    _assert_within_limits(case, admitted)
