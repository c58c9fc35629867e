"""The gateway's call book: which calls of an alias are in flight, and the observation's word
that every call requested before a time has been answered and recorded (``complete_before``),
which closes the cache-counting inference's spans (``tasks.plan_counting``), and when the
answered attempt was sent (``answered_sent_at``), which bounds what its headers reflect."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx

from gateway.aliases import load_aliases
from gateway.calls import Call, CallBook
from gateway.recorder import Observation
from gateway.spend import Reservation
from planner.classify import LimitType

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
ALIASES = load_aliases(None, provider_sim_url="http://127.0.0.1:9")


class _Recorder:
    """Keeps what the book hands to the recorder."""

    def __init__(self) -> None:
        self.observations: list[Observation] = []

    def observe(self, obs: Observation) -> None:
        self.observations.append(obs)

    def record(self, row: dict[str, Any]) -> None:
        return None


def _call(alias: str, at: datetime) -> Call:
    return Call(
        alias=ALIASES.get(alias),
        flavour="openai" if alias == "sim-openai" else "anthropic",
        reservation=Reservation(key_id="k", run_id="r", amount=0),
        instance="i",
        harness=None,
        task_age_s=None,
        requested_at=at,
        input_estimate=10,
        max_tokens=5,
    )


def test_complete_before_is_the_oldest_call_still_in_flight() -> None:
    book = CallBook(_Recorder(), clock=lambda: T0.timestamp())  # type: ignore[arg-type]
    now = T0 + timedelta(seconds=90)
    assert book.complete_before("sim-openai", now) == now  # nothing in flight
    slow, fast = _call("sim-openai", T0), _call("sim-openai", T0 + timedelta(seconds=30))
    other = _call("sim-anthropic", T0 - timedelta(seconds=60))
    for call in (slow, fast, other):
        book.started(call)
    assert book.complete_before("sim-openai", now) == T0
    book.finished(fast)
    assert book.complete_before("sim-openai", now) == T0  # the slow call still holds it
    book.finished(slow)
    assert book.complete_before("sim-openai", now) == now
    assert book.complete_before("sim-anthropic", now) == T0 - timedelta(seconds=60)
    book.finished(slow)  # settled twice: harmless


def test_an_observation_carries_the_oldest_call_in_flight() -> None:
    recorder = _Recorder()
    book = CallBook(recorder, clock=lambda: T0.timestamp())  # type: ignore[arg-type]
    slow, answered = _call("sim-openai", T0), _call("sim-openai", T0 + timedelta(seconds=5))
    book.started(slow)
    book.started(answered)
    upstream = httpx.Response(200, headers={"x-ratelimit-limit-requests": "600"})
    before = datetime.now(UTC)
    book.observe(answered, upstream, LimitType.NONE, None, None, 12.0)
    after = datetime.now(UTC)
    (obs,) = recorder.observations
    assert obs.complete_before == T0  # the slow call, requested first, is not answered yet
    # the answered attempt went out 12 s before its headers arrived: every call sent before
    # then is charged in what they state remains
    assert obs.answered_sent_at is not None
    sent = timedelta(seconds=12)
    assert before - sent <= obs.answered_sent_at <= after - sent
