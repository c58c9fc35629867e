"""Properties of the pacer core (``planner.pacer.PacerCore``) over drawn budgets and call streams.

The example tests in ``test_pacer_core`` pin each rule; these drive the core as the gateway and
the simulator do (requests as calls arrive, ``poll`` when ``next_ready_at`` says the head can
go, ``release`` when a call's answer comes) through streams no one chose, and check what the
pacer promises whatever the order it picks:

- over any interval, the calls and tokens admitted stay within the bucket's depth plus its rate
  over the interval (plus, for a call larger than the bucket, that one call's excess: it is
  admitted in debt, never twice over);
- the tokens in flight stay within the in-flight budget, except for one call alone that is
  larger than it;
- every call is admitted exactly once, and none is left waiting (no dead-lock, no starvation),
  whatever the mix of sizes, task ages, failed calls and calls that used less than estimated;
- a call that fits every bucket after any stream is admitted at once, and settled at that
  moment it leaves the token buckets charged with what it used alone (a failed call: nothing;
  its call still counts).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.budgets import Budgets, TokenClass
from planner.pacer import CallEstimate, CallUsage, PacerCore
from tests.property_support import PROPERTIES, log_uniform

#: relative slack for float sums of bucket levels
SLACK = 1e-6


@dataclass(frozen=True)
class Call:
    arrives_at: float
    estimate: CallEstimate
    service_s: float
    usage: CallUsage | None  # None: the call failed (its tokens are refunded)


@dataclass(frozen=True)
class Case:
    budgets: Budgets
    burst_s: float
    token_class: TokenClass
    cached_input_counts: bool
    calls: tuple[Call, ...]


@st.composite
def _call_stream(draw: st.DrawFn, exact: bool) -> tuple[Call, ...]:
    """Calls in arrival order; ``exact``: each uses exactly its estimate (no refund moves a
    bucket, so the admitted charges alone are bounded by the rate)."""
    calls, now = [], 0.0
    for _ in range(draw(st.integers(1, 80))):
        now += draw(st.sampled_from((0.0, 0.0, 0.01)) | st.floats(0.0, 10.0))
        estimate = CallEstimate(
            input_uncached=draw(st.integers(0, 60_000)),
            input_cached=draw(st.integers(0, 200_000)),
            max_output=draw(st.integers(0, 8_000)),
            task_age_s=draw(st.none() | st.floats(0.0, 7_200.0)),
            task_timeout_s=draw(st.none() | st.just(3_600.0)),
        )
        usage: CallUsage | None = CallUsage(
            estimate.input_uncached, estimate.input_cached, estimate.max_output
        )
        if not exact:
            usage = draw(
                st.just(usage)
                | st.none()
                | st.builds(
                    CallUsage,
                    st.integers(0, estimate.input_uncached),
                    st.integers(0, estimate.input_cached),
                    st.integers(0, estimate.max_output * 2),
                )
            )
        calls.append(Call(now, estimate, draw(st.floats(0.05, 120.0)), usage))
    return tuple(calls)


@st.composite
def _case(draw: st.DrawFn, exact: bool) -> Case:
    budgets = Budgets(
        calls_per_s=draw(log_uniform(0.05, 50.0)),
        tokens_per_s=draw(log_uniform(100.0, 1e6)),
        output_tokens_per_s=draw(st.none() | log_uniform(10.0, 1e5)),
        inflight_tokens=draw(log_uniform(1e4, 1e7)),
    )
    return Case(
        budgets=budgets,
        burst_s=draw(st.sampled_from((1.0, 10.0, 60.0)) | st.floats(0.1, 120.0)),
        token_class=draw(st.sampled_from(("input", "combined"))),
        cached_input_counts=draw(st.booleans()),
        calls=draw(_call_stream(exact)),
    )


@dataclass
class Admitted:
    at: float
    calls: float
    tokens: float
    output: float


def _drive(case: Case) -> tuple[PacerCore, dict[int, Admitted]]:
    """Run the stream through a fresh core; each call's admission (time and charges). Checks
    the in-flight budget at every admission and that the stream finishes."""
    pacer = PacerCore(
        case.budgets,
        case.burst_s,
        token_class=case.token_class,
        cached_input_counts=case.cached_input_counts,
    )
    calls = case.calls
    admitted: dict[int, Admitted] = {}
    in_flight: dict[int, int] = {}
    releases: list[tuple[float, int]] = []

    def admit(k: int, now: float) -> None:
        assert k not in admitted, f"call {k} admitted twice"
        est = calls[k].estimate
        counted = est.input_uncached + (est.input_cached if case.cached_input_counts else 0)
        if case.token_class == "combined":
            counted += est.max_output
        admitted[k] = Admitted(now, 1.0, counted, est.max_output)
        in_flight[k] = est.input_uncached + est.input_cached + est.max_output
        total = sum(in_flight.values())
        assert len(in_flight) == 1 or total <= case.budgets.inflight_tokens, (
            f"{total} tokens in flight over the budget {case.budgets.inflight_tokens}"
        )
        heapq.heappush(releases, (now + calls[k].service_s, k))

    i, now = 0, 0.0
    for _ in range(50 * len(calls) + 100):
        if i == len(calls) and not releases and pacer.queue_len == 0:
            break
        candidates = [calls[i].arrives_at] if i < len(calls) else []
        if releases:
            candidates.append(releases[0][0])
        ready = pacer.next_ready_at(now)
        if ready is not None and math.isfinite(ready):
            candidates.append(ready)
        assert candidates, f"{pacer.queue_len} calls wait for a release that never comes"
        now = max(now, min(candidates))
        while releases and releases[0][0] <= now:
            _, k = heapq.heappop(releases)
            del in_flight[k]
            pacer.release(str(k), calls[k].usage, now)
        while i < len(calls) and calls[i].arrives_at <= now:
            if pacer.request(str(i), calls[i].estimate, now).admitted:
                admit(i, now)
            i += 1
        for call_id in pacer.poll(now):
            admit(int(call_id), now)
    else:
        raise AssertionError(f"the stream did not finish: {pacer.queue_len} calls still queued")
    assert sorted(admitted) == list(range(len(calls)))
    return pacer, admitted


def _assert_within_rate(
    name: str, times: list[float], charges: list[float], rate: float, depth: float
) -> None:
    """Every interval between two admissions holds at most ``depth`` + ``rate`` x its length,
    plus the largest call's excess over the depth (admitted in debt when the bucket is full)."""
    excess = max(max(charges, default=0.0) - depth, 0.0)
    order = sorted(range(len(times)), key=times.__getitem__)
    for a, first in enumerate(order):
        total = 0.0
        for last in order[a:]:
            total += charges[last]
            allowed = depth + excess + rate * (times[last] - times[first])
            assert total <= allowed * (1 + SLACK) + SLACK, (
                f"{name}: {total:.6g} admitted in {times[last] - times[first]:.6g} s "
                f"from {times[first]:.6g} s, over {allowed:.6g}"
            )


@PROPERTIES
@given(_case(exact=True))
def test_admissions_stay_within_every_bucket_over_any_interval(case: Case) -> None:
    pacer, admitted = _drive(case)
    rows = list(admitted.values())
    times = [r.at for r in rows]
    b = case.budgets
    _assert_within_rate(
        "calls",
        times,
        [r.calls for r in rows],
        b.calls_per_s,
        max(b.calls_per_s * case.burst_s, 1.0),
    )
    _assert_within_rate(
        "tokens", times, [r.tokens for r in rows], b.tokens_per_s, b.tokens_per_s * case.burst_s
    )
    if b.output_tokens_per_s is not None:
        _assert_within_rate(
            "output tokens",
            times,
            [r.output for r in rows],
            b.output_tokens_per_s,
            b.output_tokens_per_s * case.burst_s,
        )
    assert pacer.inflight_tokens == 0 and pacer.inflight_calls == 0


@PROPERTIES
@given(_case(exact=False))
def test_every_call_is_admitted_once_whatever_it_used_or_if_it_failed(case: Case) -> None:
    pacer, admitted = _drive(case)
    assert len(admitted) == len(case.calls)
    assert pacer.inflight_tokens == 0 and pacer.inflight_calls == 0 and pacer.queue_len == 0


@dataclass(frozen=True)
class SettledCall:
    """One more call after a drawn stream, drawn to fit what the buckets then hold."""

    case: Case
    after_s: float  # how long after the stream's last release it comes
    share: float  # of the token bucket's level it takes
    cached_part: float  # of that, cache reads
    output_part: float  # of that (and of the output bucket's level), max_output
    uncounted_cached: int  # cache reads when the provider does not count them
    used: tuple[float, float, float] | None  # share of each estimate used; None: it failed


@st.composite
def _settled_call(draw: st.DrawFn) -> SettledCall:
    unit = st.floats(0.0, 1.0)
    return SettledCall(
        case=draw(_case(exact=False)),
        after_s=draw(st.floats(0.0, 30.0)),
        share=draw(unit),
        cached_part=draw(unit),
        output_part=draw(unit),
        uncounted_cached=draw(st.integers(0, 200_000)),
        used=draw(st.none() | st.tuples(unit, unit, st.floats(0.0, 2.0))),
    )


@PROPERTIES
@given(_settled_call())
def test_a_call_settled_at_once_leaves_the_buckets_charged_with_its_use_alone(
    drawn: SettledCall,
) -> None:
    """After any stream, a call that fits every bucket is admitted at once; released at that
    moment, the token buckets stand where its actual use alone would put them (a failed call:
    where they were), and the calls bucket one call lower (a failed call still counts)."""
    case = drawn.case
    pacer, admitted = _drive(case)
    b = case.budgets
    # the stream's last event: its last release
    end = max(r.at + case.calls[k].service_s for k, r in admitted.items())
    levels = pacer.levels(end)
    # wait until every bucket holds the one call this test sends (a level may be in debt)
    deficits = [(1.0 - levels["calls"]) / b.calls_per_s, -levels["tokens"] / b.tokens_per_s]
    if b.output_tokens_per_s is not None:
        deficits.append(-levels["output_tokens"] / b.output_tokens_per_s)
    now = end + drawn.after_s + max(0.0, *deficits) + 1e-6
    before = pacer.levels(now)
    room = math.floor(before["tokens"] * drawn.share)
    output_room = room if b.output_tokens_per_s is None else min(room, before["output_tokens"])
    max_output = math.floor(output_room * drawn.output_part)
    if case.token_class == "combined":
        room -= max_output
    cached = math.floor(room * drawn.cached_part)
    counts = case.cached_input_counts
    estimate = CallEstimate(
        input_uncached=room - cached if counts else room,
        # a cache read the provider does not count costs the bucket nothing: any size fits
        input_cached=cached if counts else drawn.uncounted_cached,
        max_output=max_output,
    )
    assert pacer.request("x", estimate, now).admitted, (estimate, before)
    usage = None
    if drawn.used is not None:
        uncached_used, cached_used, output_used = drawn.used
        usage = CallUsage(
            math.floor(estimate.input_uncached * uncached_used),
            math.floor(estimate.input_cached * cached_used),
            math.floor(estimate.max_output * output_used),
        )
    pacer.release("x", usage, now)
    after = pacer.levels(now)
    used_counted = used_output = 0
    if usage is not None:
        used_counted = usage.input_uncached + (usage.input_cached if counts else 0)
        if case.token_class == "combined":
            used_counted += usage.output
        used_output = usage.output
    assert after["calls"] == pytest.approx(before["calls"] - 1.0, rel=SLACK, abs=SLACK)
    assert after["tokens"] == pytest.approx(before["tokens"] - used_counted, rel=SLACK, abs=SLACK)
    if b.output_tokens_per_s is not None:
        assert after["output_tokens"] == pytest.approx(
            before["output_tokens"] - used_output, rel=SLACK, abs=SLACK
        )
    assert pacer.inflight_tokens == 0 and pacer.inflight_calls == 0
