"""The order of the pacer core's queue (``planner.pacer``): FIFO under the calls bucket,
smallest prompt first (ageing) under the counted-token bucket, task age under the output
bucket; a change of order re-ranks what is queued. Split from ``test_pacer_core.py``."""

from __future__ import annotations

import math

import pytest

from planner.pacer import AGEING_TOKENS_PER_S, CallEstimate, CallUsage, PacerCore
from planner.pacer_order import QueueOrder
from tests.pacer_support import budgets, drive


def test_under_a_token_limit_the_smallest_prompt_goes_first() -> None:
    pacer = PacerCore(budgets(calls=1000.0, tokens=1000.0), burst_s=1.0)
    assert pacer.request("a", CallEstimate(1000), 0.0).admitted  # the bucket is empty
    assert not pacer.request("b", CallEstimate(10), 0.0).admitted  # held by the token bucket
    assert not pacer.request("big", CallEstimate(900), 0.001).admitted
    assert not pacer.request("small", CallEstimate(100), 0.002).admitted
    # FIFO would hold "small" behind "big" until t=0.91
    assert pacer.poll(0.5) == ["b", "small"]
    assert pacer.poll(0.95) == []
    assert pacer.poll(1.02) == ["big"]


def test_under_a_calls_limit_the_order_stays_fifo() -> None:
    pacer = PacerCore(budgets(calls=1.0, tokens=1e9), burst_s=1.0)
    assert pacer.request("a", CallEstimate(10), 0.0).admitted
    assert not pacer.request("b", CallEstimate(10), 0.0).admitted  # held by the calls bucket
    assert not pacer.request("big", CallEstimate(900), 0.001).admitted
    assert not pacer.request("small", CallEstimate(100), 0.002).admitted
    assert pacer.poll(1.0) == ["b"]
    assert pacer.poll(2.0) == ["big"]
    assert pacer.poll(3.0) == ["small"]


def test_a_big_call_ages_past_a_stream_of_small_ones() -> None:
    """Smallest prompt first, but a queued call gains AGEING_TOKENS_PER_S of priority per second:
    a 5,000-token call is passed only by small calls that arrive within 4.9 s after it."""
    pacer = PacerCore(budgets(tokens=1000.0), burst_s=1.0)
    small = [
        (i * 0.05, f"s{i}", CallEstimate(100), 0.2, CallUsage(100)) for i in range(4000)
    ]  # 2,000 tokens/s of demand against 1,000/s
    big = [(10.0, "big", CallEstimate(5000), 1.0, CallUsage(5000))]
    times = drive(pacer, sorted(small + big), until=400.0)
    assert "big" in times
    passed_by = [i for i in range(4000) if times.get(f"s{i}", math.inf) < times["big"]]
    assert max(passed_by) * 0.05 - 10.0 == pytest.approx(
        (5000 - 100) / AGEING_TOKENS_PER_S, abs=0.1
    )
    assert times["big"] < 60.0


def test_when_the_holding_bucket_changes_the_queue_is_re_ranked() -> None:
    """Calls queued while a token bucket held the queue (smallest prompt first) go in arrival
    order once the calls bucket is what holds it: no call keeps a rank from the old order."""
    pacer = PacerCore(budgets(calls=1000.0, tokens=1000.0), burst_s=1.0)
    assert pacer.request("a", CallEstimate(1000), 0.0).admitted  # the token bucket is empty
    for i, (call, prompt) in enumerate(
        [("big1", 900), ("big2", 800), ("small", 100), ("mid", 500)]
    ):
        assert not pacer.request(call, CallEstimate(prompt), 0.001 * (i + 1)).admitted
    # now the request limit binds: one call per 10 s, tokens plentiful
    pacer.set_budgets(budgets(calls=0.1, tokens=1e9), 0.01)
    assert pacer.poll(0.02) == ["small"]  # ranked while the token bucket held the queue
    admitted: list[str] = []
    t = 0.02
    while len(admitted) < 3:
        t += 1.0
        admitted += pacer.poll(t)  # each poll finds the head held by the calls bucket
    assert admitted == ["big1", "big2", "mid"]  # FIFO, not the prompt order mid, big2, big1


def test_under_an_output_limit_the_older_task_goes_first_not_the_smaller_prompt() -> None:
    """Output per call does not grow with a task's age: the smallest-prompt order would only
    favour young tasks. Under the output bucket a call's task age counts as its time queued."""
    pacer = PacerCore(budgets(tokens=1e9, output=100.0), burst_s=1.0)
    assert pacer.request("a", CallEstimate(10, max_output=100), 0.0).admitted  # bucket empty
    assert not pacer.request("b", CallEstimate(10, max_output=100), 0.0).admitted
    assert pacer.poll(1.0) == ["b"]  # the head was held by the output bucket: the order flips
    young = CallEstimate(1_000, max_output=100, task_age_s=5.0)
    old = CallEstimate(50_000, max_output=100, task_age_s=600.0)
    unknown = CallEstimate(2_000, max_output=100)  # ranks as a task started when it arrived
    assert not pacer.request("young", young, 1.0).admitted
    assert not pacer.request("unknown", unknown, 1.001).admitted
    assert not pacer.request("old", old, 1.002).admitted  # queued last, its task 600 s old
    assert [*pacer.poll(3.0), *pacer.poll(4.0), *pacer.poll(5.0)] == ["old", "young", "unknown"]


def test_under_an_output_limit_a_young_tasks_call_ranks_as_arriving_the_age_gap_later() -> None:
    """An old task's calls pass a young task's queued call only while they arrive within the
    two tasks' age gap of it: the young task is delayed, never starved."""
    pacer = PacerCore(budgets(calls=1000.0, tokens=1e9, output=1000.0), burst_s=1.0)
    # an old task (started at -300) floods the queue: 2,000 output tokens/s against 1,000/s
    old = [
        (
            i * 0.05,
            f"o{i}",
            CallEstimate(100, max_output=100, task_age_s=300.0 + i * 0.05),
            0.2,
            CallUsage(100, output=100),
        )
        for i in range(8000)
    ]
    young = [
        (
            10.0,
            "young",
            CallEstimate(100, max_output=100, task_age_s=0.0),
            0.2,
            CallUsage(100, output=100),
        )
    ]
    times = drive(pacer, sorted(old + young), until=800.0)
    assert "young" in times
    passed_by = [i * 0.05 for i in range(8000) if times.get(f"o{i}", math.inf) < times["young"]]
    # rank = arrival + task start: the old task's call arriving at t ranks t - 300, the young
    # call (arrived at 10, its task started at 10) ranks 20; old calls arriving up to the age
    # gap (310 s) after it pass it, none later
    assert max(passed_by) == pytest.approx(320.0, abs=0.1)


def test_with_old_tasks_first_off_an_output_bound_queue_goes_in_arrival_order() -> None:
    """Once the planner says an old task is not the long one (no instance left to launch, a
    narrow curve), the output-bound queue is re-ranked in arrival order, and back again."""
    pacer = PacerCore(budgets(tokens=1e9, output=100.0), burst_s=1.0)
    assert pacer.request("a", CallEstimate(10, max_output=100), 0.0).admitted  # bucket empty
    assert not pacer.request("b", CallEstimate(10, max_output=100), 0.0).admitted
    assert pacer.poll(1.0) == ["b"]  # the head was held by the output bucket: task-age order
    for i, (name, age) in enumerate((("young", 5.0), ("mid", 200.0), ("old", 600.0))):
        est = CallEstimate(1_000, max_output=100, task_age_s=age)
        assert not pacer.request(name, est, 1.0 + i * 0.001).admitted
    assert pacer.old_tasks_first
    pacer.set_old_tasks_first(False)  # the calls already queued are re-ranked
    assert [*pacer.poll(3.0), *pacer.poll(4.0)] == ["young", "mid"]
    pacer.set_old_tasks_first(True)
    for i, (name, age) in enumerate((("young2", 5.0), ("old2", 900.0))):
        est = CallEstimate(1_000, max_output=100, task_age_s=age)
        assert not pacer.request(name, est, 4.5 + i * 0.001).admitted
    assert [*pacer.poll(5.0), *pacer.poll(6.0), *pacer.poll(7.0)] == ["old2", "old", "young2"]


def test_a_task_near_its_instance_timeout_goes_first_in_every_order() -> None:
    """With an urgent share, past that share of its timeout a task's call goes before every
    other, the oldest task's first: under a token limit the big prompt of an old task would
    otherwise wait behind every small one, and under a calls limit behind every earlier
    arrival. Without one (the default) the orders are as before."""
    timeout = 1000.0
    share = 0.75
    old = share * timeout

    def est(prompt: int, age: float, timeout_s: float | None = timeout) -> CallEstimate:
        return CallEstimate(prompt, task_age_s=age, task_timeout_s=timeout_s)

    tokens = PacerCore(budgets(calls=1000.0, tokens=1000.0), burst_s=1.0, urgent_share=share)
    assert tokens.request("a", est(1000, 10.0), 0.0).admitted  # the token bucket is empty
    assert not tokens.request("small", est(10, 10.0), 0.0).admitted
    assert not tokens.request("older", est(500, old + 50.0), 0.001).admitted
    assert not tokens.request("oldest", est(800, old + 100.0), 0.002).admitted
    assert not tokens.request("no-timeout", est(500, old + 500.0, None), 0.003).admitted
    assert tokens.poll(0.81) == ["oldest"]
    assert tokens.poll(1.32) == ["older", "small"]
    for urgent_share, expected in (
        (share, ["urgent", "first", "young"]),
        (None, ["first", "young", "urgent"]),
    ):
        calls = PacerCore(budgets(calls=1.0, tokens=1e9), burst_s=1.0, urgent_share=urgent_share)
        assert calls.request("a", est(10, 10.0), 0.0).admitted
        assert not calls.request("first", est(10, 10.0), 0.0).admitted
        assert not calls.request("young", est(10, old - 1.0), 0.001).admitted
        assert not calls.request("urgent", est(10, old), 0.002).admitted
        assert [calls.poll(t) for t in (1.0, 2.0, 3.0)] == [[c] for c in expected]


def test_a_task_past_its_instance_timeout_is_not_urgent() -> None:
    """Past its timeout a task's attempt is lost (its harness stops it): a call it left queued
    ranks as any other, and the tasks that can still make their timeout go first. Ranked
    urgent, the oldest first, the dead tasks would take the rank before every live one."""
    timeout = 1000.0

    def est(age: float) -> CallEstimate:
        return CallEstimate(10, task_age_s=age, task_timeout_s=timeout)

    calls = PacerCore(budgets(calls=1.0, tokens=1e9), burst_s=1.0, urgent_share=0.75)
    assert calls.request("a", est(10.0), 0.0).admitted
    assert not calls.request("first", est(10.0), 0.0).admitted
    assert not calls.request("dead", est(timeout), 0.001).admitted
    assert not calls.request("dying", est(timeout - 1.0), 0.002).admitted
    assert not calls.request("urgent", est(0.75 * timeout), 0.003).admitted
    assert [calls.poll(t) for t in (1.0, 2.0, 3.0, 4.0)] == [
        ["dying"],
        ["urgent"],
        ["first"],
        ["dead"],
    ]


def test_an_estimates_timeout_must_be_positive_and_an_urgent_share_a_share() -> None:
    with pytest.raises(ValueError, match="task_timeout_s"):
        CallEstimate(10, task_timeout_s=0.0)
    with pytest.raises(ValueError, match="urgent_share"):
        PacerCore(budgets(), burst_s=1.0, urgent_share=1.5)
    order = QueueOrder(0.5)
    assert order.urgent(CallEstimate(10, task_age_s=50.0, task_timeout_s=100.0))
    assert not order.urgent(CallEstimate(10, task_age_s=5000.0))  # no timeout: never urgent
    assert not order.urgent(CallEstimate(10, task_timeout_s=100.0))  # no age: never urgent
    assert not QueueOrder().urgent(CallEstimate(10, task_age_s=99.0, task_timeout_s=100.0))
