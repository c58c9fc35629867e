"""Gateway operations: the pause flag, observed rate-limit headers, bad requests, the task age
the pacer is told."""

from __future__ import annotations

import time
from collections.abc import Callable

import httpx
import pytest
from sqlalchemy import select

from gateway.pacer_local import InProcessPacer
from gateway.pacing import CallEstimate, Permit
from ledger.models import COMPLETE_BEFORE_KEY, AliasObservation
from ledger.pauses import set_pause
from tests.gateway.gw_helpers import Stack


def _post(
    stack: Stack, secret: str, body: object, path: str = "/v1/chat/completions"
) -> httpx.Response:
    return httpx.post(
        stack.url + path, headers={"authorization": f"Bearer {secret}"}, json=body, timeout=5
    )


BODY = {"model": "sim-openai", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}


def test_paused_gateway_pool_answers_503_with_retry_after(make_stack: Callable[..., Stack]) -> None:
    stack = make_stack()
    secret = stack.new_run().gateway_key.get_secret_value()
    assert _post(stack, secret, BODY).status_code == 200
    set_pause(stack.engine, "pool", "gateway", True, actor="test", reason="maintenance")
    try:
        deadline = time.monotonic() + 2.0
        while (r := _post(stack, secret, BODY)).status_code != 503:
            assert time.monotonic() < deadline, "the pause was not seen within 2 s"
            time.sleep(0.05)
        assert int(r.headers["retry-after"]) > 0
        assert "paused" in r.json()["error"]["message"]
    finally:
        set_pause(stack.engine, "pool", "gateway", False, actor="test", reason="done")
    deadline = time.monotonic() + 2.0
    while _post(stack, secret, BODY).status_code != 200:
        assert time.monotonic() < deadline, "the resume was not seen within 2 s"
        time.sleep(0.05)


def test_observed_rate_limit_headers_are_kept_per_alias(make_stack: Callable[..., Stack]) -> None:
    stack = make_stack()
    secret = stack.new_run().gateway_key.get_secret_value()
    assert _post(stack, secret, BODY).status_code == 200
    deadline = time.monotonic() + 3.0
    while True:
        with stack.engine.connect() as conn:
            obs = conn.execute(
                select(AliasObservation).where(AliasObservation.alias == "sim-openai")
            ).one_or_none()
        if obs is not None and obs.observed_at.timestamp() > time.time() - 10:
            break
        assert time.monotonic() < deadline, "no observation written"
        time.sleep(0.05)
    assert obs.headers["x-ratelimit-limit-requests"] == "600"
    assert obs.limits["limits"]["requests"] == 600.0
    assert obs.limits["limits"]["tokens"] == 1_800_000.0
    # nothing else in flight: every call requested before the observation was answered
    complete = obs.limits[COMPLETE_BEFORE_KEY]
    assert time.time() - 10 < complete <= obs.observed_at.timestamp() + 1e-6


def test_bad_requests_are_clear_and_not_forwarded(make_stack: Callable[..., Stack]) -> None:
    stack = make_stack()
    secret = stack.new_run().gateway_key.get_secret_value()
    before = dict(stack.sim.stats)
    r = _post(stack, secret, {**BODY, "model": "nope"})
    assert r.status_code == 404 and "unknown gateway alias 'nope'" in r.json()["error"]["message"]
    r = _post(stack, secret, BODY, path="/v1/messages")
    assert r.status_code == 400 and "served on /v1/chat/completions" in r.json()["error"]["message"]
    r = _post(
        stack,
        secret,
        {k: v for k, v in BODY.items() if k != "max_tokens"} | {"model": "sim-anthropic"},
        path="/v1/messages",
    )
    assert r.status_code == 400 and "max_tokens" in r.json()["error"]["message"]
    r = httpx.post(
        stack.url + "/v1/chat/completions",
        content=b"{not json",
        headers={"authorization": f"Bearer {secret}"},
        timeout=5,
    )
    assert r.status_code == 400 and "not valid JSON" in r.json()["error"]["message"]
    r = httpx.post(stack.url + "/v1/chat/completions", json=BODY, timeout=5)
    assert r.status_code == 401
    assert stack.sim.stats == before


def test_the_pacer_holds_no_more_than_the_providers_remaining(
    make_stack: Callable[..., Stack],
) -> None:
    """The provider's headers say how much of its minute is left; the pacer's buckets (deep
    here: 10,000 calls) come down to it, so a burst the provider cannot take is not sent."""
    stack = make_stack()
    secret = stack.new_run().gateway_key.get_secret_value()
    pacer = stack.gateway.pacer
    assert isinstance(pacer, InProcessPacer)  # make_stack's default
    assert pacer.levels("sim-openai")["calls"] > 9_000
    r = _post(stack, secret, BODY)
    assert r.status_code == 200
    left = float(r.headers["x-ratelimit-remaining-requests"])
    assert left < 600
    # the pacer refills at its own rate from there: allow a second of it
    assert pacer.levels("sim-openai")["calls"] <= left + pacer.budgets("sim-openai").calls_per_s


def test_a_429_that_says_nothing_of_the_buckets_holds_the_alias(
    make_stack: Callable[..., Stack],
) -> None:
    """A provider rejecting a call without rate-limit headers has an empty bucket: the pacer
    sends nothing on the alias for its hold_after_429_s of refill (retries would be rejected
    too), and a 429 with headers syncs to what they say instead."""
    from planner.classify import LimitType

    stack = make_stack()
    pacer = stack.gateway.pacer
    assert isinstance(pacer, InProcessPacer)  # make_stack's default
    alias = next(a for a in stack.gateway.aliases if a.name == "sim-openai")
    hold = alias.pacer.hold_after_429_s
    assert hold > 0
    pacer.hold("sim-openai")
    levels = pacer.levels("sim-openai")
    rate = pacer.budgets("sim-openai").calls_per_s
    assert levels["calls"] <= -rate * hold * 0.99
    pacer.observe_remaining("sim-openai", {LimitType.REQUESTS: 3.0})  # never raises a level
    assert pacer.levels("sim-openai")["calls"] < 0


def test_a_429_holds_only_the_buckets_it_leaves_empty_unsaid(
    make_stack: Callable[..., Stack],
) -> None:
    """A 429 whose headers state the remaining of the class it names is mirrored, not held; one
    that states nothing holds every bucket (planner.pacer.classes_to_hold)."""
    from planner.classify import Classification, LimitType

    stack = make_stack()
    pacer = stack.gateway.pacer
    assert isinstance(pacer, InProcessPacer)  # make_stack's default
    stated = Classification(
        status=429,
        limit_type=LimitType.TOKENS,
        remaining={LimitType.REQUESTS: 400.0, LimitType.TOKENS: 1e9},
    )
    pacer.hold("sim-openai", stated)
    assert pacer.levels("sim-openai")["calls"] > 0
    pacer.hold("sim-openai", Classification(status=429, limit_type=LimitType.TOKENS))
    assert pacer.levels("sim-openai")["calls"] < 0
    # a per-day limit's 429 holds every bucket for its retry-after, headers or not
    daily = Classification(
        status=429, limit_type=LimitType.DAILY, remaining=stated.remaining, retry_after_s=120.0
    )
    pacer.hold("sim-openai", daily)
    budgets = pacer.budgets("sim-openai")
    levels = pacer.levels("sim-openai")
    assert levels["calls"] <= -budgets.calls_per_s * 119.0
    assert levels["tokens"] <= -budgets.tokens_per_s * 119.0


def test_the_pacer_is_told_each_calls_task_age(make_stack: Callable[..., Stack]) -> None:
    """The pacer ranks its queue by task age under an output limit: the gateway passes the age
    the harness states (``x-evalfleet-task-started-at``), else the time since it first saw the
    instance."""
    seen: list[CallEstimate] = []

    class RecordingPacer(InProcessPacer):
        async def acquire(self, alias: str, estimate: CallEstimate) -> Permit:
            seen.append(estimate)
            return await super().acquire(alias, estimate)

    stack = make_stack(pacer=RecordingPacer)
    secret = stack.new_run().gateway_key.get_secret_value()
    headers = {"authorization": f"Bearer {secret}", "x-evalfleet-instance": "django-1"}

    def post(extra: dict[str, str]) -> None:
        r = httpx.post(
            stack.url + "/v1/chat/completions", headers={**headers, **extra}, json=BODY, timeout=5
        )
        assert r.status_code == 200

    post({"x-evalfleet-task-started-at": str(time.time() - 120.0)})
    post({})  # first sight of the instance without a stated start: age 0
    time.sleep(0.3)
    post({})
    # a start that is no finite number is ignored, as if none was sent: not a 500
    post({"x-evalfleet-task-started-at": "-inf"})
    post({"x-evalfleet-task-started-at": "yesterday"})
    stated, first, later, minus_inf, junk = (e.task_age_s for e in seen)
    assert stated == pytest.approx(120.0, abs=5.0)
    assert first == pytest.approx(0.0, abs=0.05)
    assert later is not None and 0.3 <= later < 5.0
    for ignored in (minus_inf, junk):
        assert ignored is not None and later <= ignored < 5.0
    # the task's instance timeout, near which its calls go first; junk is no timeout
    assert [e.task_timeout_s for e in seen] == [None] * 5
    post({"x-evalfleet-task-timeout-s": "1800"})
    for junk_timeout in ("0", "-5", "nan", "inf", "soon"):
        post({"x-evalfleet-task-timeout-s": junk_timeout})
    assert [e.task_timeout_s for e in seen[5:]] == [1800.0] + [None] * 5
