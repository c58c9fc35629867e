"""Provider wire format: everything rendered classifies back to the right limit type."""

from __future__ import annotations

import pytest

from planner.classify import LimitType, classify, parse_go_duration, parse_rate_limit_headers
from sim.limits import CallCharge, LimitSpec, ProviderLimits
from sim.protocol import (
    go_duration,
    rate_limit_headers,
    render_overload,
    render_rejection,
    render_spend,
    rfc3339,
)

EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0s"),
        (0.12, "120ms"),
        (0.0005, "500µs"),
        (1.0, "1s"),
        (1.5, "1.5s"),
        (360.0, "6m0s"),
        (3723.5, "1h2m3.5s"),
        (59.9994, "59.999s"),
    ],
)
def test_go_duration(seconds: float, text: str) -> None:
    assert go_duration(seconds) == text
    back = parse_go_duration(text)
    assert back is not None and back == pytest.approx(seconds, abs=1e-3)


def test_rfc3339_rounds_up() -> None:
    assert rfc3339(EPOCH) == "2026-01-01T00:00:00Z"
    assert rfc3339(EPOCH + 0.2) == "2026-01-01T00:00:01Z"


def _exhaust(spec: LimitSpec, charge: CallCharge) -> tuple[ProviderLimits, object]:
    p = ProviderLimits(spec)
    for _ in range(100_000):
        a = p.admit(0.0, charge)
        if not a.admitted:
            return p, a
    raise AssertionError("never rejected")


SPECS = {
    LimitType.REQUESTS: (LimitSpec(rpm=10, input_tpm=1e9, output_tpm=1e9), CallCharge(5, 0, 5)),
    LimitType.INPUT_TOKENS: (
        LimitSpec(rpm=1e6, input_tpm=1000, output_tpm=1e9),
        CallCharge(300, 0, 5),
    ),
    LimitType.OUTPUT_TOKENS: (
        LimitSpec(rpm=1e6, input_tpm=1e9, output_tpm=1000),
        CallCharge(5, 0, 300),
    ),
    LimitType.TOKENS: (LimitSpec(rpm=1e6, tpm=1000), CallCharge(200, 0, 100)),
}

# OpenAI reveals requests and one token limit (here the input one); a token 429 stating
# another limit than that header's is an output-token limit; "none" reveals nothing.
EXPECTED = {
    "anthropic": {c: c for c in SPECS},
    "openai": {
        LimitType.REQUESTS: LimitType.REQUESTS,
        LimitType.INPUT_TOKENS: LimitType.TOKENS,
        LimitType.OUTPUT_TOKENS: LimitType.OUTPUT_TOKENS,
        LimitType.TOKENS: LimitType.TOKENS,
    },
    "none": {c: LimitType.UNKNOWN for c in SPECS},
}


@pytest.mark.parametrize("style", ["openai", "anthropic", "none"])
@pytest.mark.parametrize("limit", list(SPECS))
def test_rejections_round_trip_through_classify(style: str, limit: LimitType) -> None:
    spec, charge = SPECS[limit]
    p, rejection = _exhaust(spec, charge)
    assert rejection.limit is limit  # type: ignore[attr-defined]
    snap = p.snapshot(0.0)
    resp = render_rejection(style, rejection, snap, EPOCH)  # type: ignore[arg-type]
    assert resp.status == 429
    c = classify(resp.status, resp.headers, resp.body, now_epoch=EPOCH)
    assert c.limit_type is EXPECTED[style][limit]
    assert not c.too_large
    if style == "none":
        assert c.retry_after_s is None and not c.limits
    else:
        assert c.retry_after_s is not None
        assert c.retry_after_s >= rejection.retry_after_s  # type: ignore[attr-defined]


@pytest.mark.parametrize("style", ["openai", "anthropic"])
def test_too_large_round_trips(style: str) -> None:
    p = ProviderLimits(LimitSpec(rpm=100, tpm=30000))
    rejection = p.admit(0.0, CallCharge(50000))
    assert rejection.too_large
    resp = render_rejection(style, rejection, p.snapshot(0.0), EPOCH)
    c = classify(resp.status, resp.headers, resp.body, now_epoch=EPOCH)
    assert c.limit_type is LimitType.TOKENS
    if style == "openai":
        assert c.too_large
        assert "Request too large" in c.message and "Requested 50000" in c.message


@pytest.mark.parametrize("style", ["openai", "anthropic", "none"])
def test_overload_and_spend_round_trip(style: str) -> None:
    over = render_overload(style, retry_after_s=2.5)
    c = classify(over.status, over.headers, over.body)
    assert c.limit_type is LimitType.OVERLOAD and c.retry_after_s == 3.0
    assert over.status == (529 if style == "anthropic" else 503)
    spend = render_spend(style)
    assert classify(spend.status, spend.headers, spend.body).limit_type is LimitType.SPEND


def test_anthropic_headers_round_trip_limits_remaining_and_resets() -> None:
    p = ProviderLimits(LimitSpec(rpm=4000, input_tpm=2_000_000, output_tpm=400_000))
    p.admit(0.0, CallCharge(600_000, 0, 100_000))
    snap = p.snapshot(0.0)
    headers = rate_limit_headers("anthropic", snap, EPOCH)
    parsed = parse_rate_limit_headers(headers, now_epoch=EPOCH)
    assert parsed.style == "anthropic"
    assert parsed.limits == {
        LimitType.REQUESTS: 4000,
        LimitType.INPUT_TOKENS: 2_000_000,
        LimitType.OUTPUT_TOKENS: 400_000,
        LimitType.TOKENS: 2_000_000,  # the token class nearest exhaustion (70% vs 75% left)
    }
    assert parsed.remaining[LimitType.INPUT_TOKENS] == 1_400_000
    assert parsed.remaining[LimitType.OUTPUT_TOKENS] == 300_000
    # 600k of 2M at 33,333/s -> 18 s to full; RFC 3339 rounds up to the second
    assert parsed.resets_s[LimitType.INPUT_TOKENS] == pytest.approx(18.0, abs=1.0)
    # a 200 with these headers is not a limit error
    assert classify(200, headers, b"{}").limit_type is LimitType.NONE


def test_openai_headers_reveal_requests_and_one_token_limit() -> None:
    p = ProviderLimits(LimitSpec(rpm=500, tpm=30_000))
    p.admit(0.0, CallCharge(6000, 0, 0))
    headers = rate_limit_headers("openai", p.snapshot(0.0), EPOCH)
    assert headers["x-ratelimit-limit-requests"] == "500"
    assert headers["x-ratelimit-remaining-tokens"] == "24000"
    assert headers["x-ratelimit-reset-tokens"] == "12s"
    assert headers["x-ratelimit-reset-requests"] == "120ms"
    assert rate_limit_headers("none", p.snapshot(0.0), EPOCH) == {}


def test_bad_style_is_rejected() -> None:
    with pytest.raises(ValueError, match="style"):
        render_overload("azure")
