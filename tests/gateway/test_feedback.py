"""What a provider's answer teaches the pacer at once (``gateway.feedback``): a call's first 429
cuts, a retry's does not; every rejection mirrors what it states and holds what it does not;
an overload or a spend error cuts nothing; a success mirrors its headers and keeps the reading
for judging a later token 429; a request 429 is never read as evidence about cache counting."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import httpx

from gateway.aliases import load_aliases
from gateway.calls import Call
from gateway.feedback import ProviderFeedback
from gateway.pacer_local import token_class
from gateway.send_log import SendLog
from gateway.spend import Reservation
from planner.classify import Classification, LimitType, classify

ALIASES = load_aliases(None, provider_sim_url="http://127.0.0.1:9")
T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
NOW = T0.timestamp()


class _RecordingPacer:
    """Records what the feedback asks of a pacer (the part of ``gateway.pacing.Pacer`` it uses)."""

    def __init__(self, counts_cache: bool = False) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.counts_cache = counts_cache

    def cut_at_429(self, alias: str, view: Classification) -> None:
        self.calls.append(("cut", view.limit_type))

    def observe_remaining(self, alias: str, remaining: Mapping[LimitType, float]) -> None:
        self.calls.append(("mirror", dict(remaining)))

    def hold(
        self, alias: str, view: Classification | None = None, *, elapsed_s: float = 0.0
    ) -> None:
        self.calls.append(("hold", None if view is None else view.limit_type))

    def cached_input_counts(self, alias: str) -> bool:
        return self.counts_cache

    def recount(self, alias: str, counts: bool) -> None:
        self.calls.append(("recount", counts))


def _call(*, retry: bool = False) -> Call:
    return Call(
        alias=ALIASES.get("sim-openai"),
        flavour="openai",
        reservation=Reservation(key_id="k", run_id="r", amount=0),
        instance="i-1",
        harness="h",
        task_age_s=10.0,
        requested_at=T0,
        input_estimate=1000,
        max_tokens=100,
        retry=retry,
    )


def _feedback(pacer: _RecordingPacer) -> tuple[ProviderFeedback, SendLog]:
    sends = SendLog()
    return ProviderFeedback(pacer, sends, lambda: NOW), sends  # type: ignore[arg-type]


REQUEST_429 = classify(
    429,
    httpx.Headers(
        {
            "x-ratelimit-limit-requests": "500",
            "x-ratelimit-remaining-requests": "0",
            "x-ratelimit-reset-requests": "120ms",
            "retry-after": "1",
        }
    ),
    b'{"error": {"message": "Rate limit reached for requests", "type": "requests",'
    b' "code": "rate_limit_exceeded"}}',
    now_epoch=NOW,
)


TOKENS_429 = classify(
    429,
    httpx.Headers({"x-ratelimit-limit-tokens": "1000000", "x-ratelimit-remaining-tokens": "0"}),
    b'{"error": {"message": "Rate limit reached for tokens", "type": "tokens",'
    b' "code": "rate_limit_exceeded"}}',
    now_epoch=NOW,
)


def test_a_first_429_cuts_and_a_retrys_only_mirrors_and_holds() -> None:
    assert REQUEST_429.limit_type is LimitType.REQUESTS
    pacer = _RecordingPacer()
    feedback, _ = _feedback(pacer)
    feedback.rejected(_call(), REQUEST_429)
    assert pacer.calls == [
        ("cut", LimitType.REQUESTS),
        ("mirror", {LimitType.REQUESTS: 0.0}),
        ("hold", LimitType.REQUESTS),
    ]
    pacer.calls.clear()
    feedback.rejected(_call(retry=True), REQUEST_429)
    assert ("cut", LimitType.REQUESTS) not in pacer.calls
    assert pacer.calls == [("mirror", {LimitType.REQUESTS: 0.0}), ("hold", LimitType.REQUESTS)]


def test_an_overload_cuts_nothing() -> None:
    overload = classify(
        529,
        httpx.Headers({"retry-after": "5"}),
        b'{"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}',
        now_epoch=NOW,
    )
    assert overload.limit_type is LimitType.OVERLOAD
    pacer = _RecordingPacer()
    feedback, _ = _feedback(pacer)
    feedback.rejected(_call(), overload)
    assert [name for name, _ in pacer.calls] == ["hold"]  # the pacer's rule: nothing for overload


def test_a_success_mirrors_its_headers_and_keeps_the_reading() -> None:
    pacer = _RecordingPacer()
    feedback, sends = _feedback(pacer)
    attempt = sends.sent("sim-openai", NOW - 1.0, 1000)
    sends.answered(attempt, 1000, 0)
    ok = httpx.Response(
        200,
        headers={
            "x-ratelimit-limit-tokens": "1000000",
            "x-ratelimit-remaining-tokens": "250000",
        },
    )
    alias = _call().alias
    judged = (TOKENS_429.limits, TOKENS_429.remaining, token_class(alias))
    assert sends.window_at("sim-openai", NOW + 2.0, *judged) is None  # no reading yet
    feedback.served(_call(), ok, NOW - 1.0)
    assert pacer.calls == [("mirror", {LimitType.TOKENS: 250000.0})]
    # a token 429 shortly after is judged from that reading
    assert sends.window_at("sim-openai", NOW + 4.0, *judged) is not None
    # a success that states nothing teaches nothing
    pacer.calls.clear()
    feedback.served(_call(), httpx.Response(200), NOW - 1.0)
    assert pacer.calls == []


def test_a_request_429_is_no_evidence_about_cache_counting() -> None:
    pacer = _RecordingPacer()
    feedback, _ = _feedback(pacer)
    assert feedback.judge_counting(_call(), REQUEST_429, NOW - 0.5) is False
    # nor is a token 429 when the pacer already counts cache reads
    assert TOKENS_429.limit_type is LimitType.TOKENS
    counting = _RecordingPacer(counts_cache=True)
    assert _feedback(counting)[0].judge_counting(_call(), TOKENS_429, NOW - 0.5) is False
    assert pacer.calls == [] and counting.calls == []
