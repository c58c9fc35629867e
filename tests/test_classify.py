"""The 429 classifier, table-driven over real OpenAI and Anthropic response shapes."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from planner.classify import LimitType, classify, parse_go_duration, parse_rate_limit_headers

EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z

OPENAI_HEADERS = {
    "x-ratelimit-limit-requests": "500",
    "x-ratelimit-limit-tokens": "30000",
    "x-ratelimit-remaining-requests": "0",
    "x-ratelimit-remaining-tokens": "29100",
    "x-ratelimit-reset-requests": "120ms",
    "x-ratelimit-reset-tokens": "1.8s",
}
OPENAI_TAIL = (
    "Visit https://platform.openai.com/account/rate-limits to learn more. You can increase your "
    "rate limit by adding a payment method to your account at "
    "https://platform.openai.com/account/billing."
)


def openai_error(message: str, etype: str | None, code: str | None) -> dict[str, object]:
    return {"error": {"message": message, "type": etype, "param": None, "code": code}}


def anthropic_error(etype: str, message: str) -> dict[str, object]:
    return {"type": "error", "error": {"type": etype, "message": message}}


def anth_headers(**remaining: str) -> dict[str, str]:
    h = {
        "anthropic-ratelimit-requests-limit": "4000",
        "anthropic-ratelimit-requests-remaining": remaining.get("requests", "3999"),
        "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:01Z",
        "anthropic-ratelimit-input-tokens-limit": "2000000",
        "anthropic-ratelimit-input-tokens-remaining": remaining.get("input", "1500000"),
        "anthropic-ratelimit-input-tokens-reset": "2026-01-01T00:00:15Z",
        "anthropic-ratelimit-output-tokens-limit": "400000",
        "anthropic-ratelimit-output-tokens-remaining": remaining.get("output", "390000"),
        "anthropic-ratelimit-output-tokens-reset": "2026-01-01T00:00:02Z",
        "anthropic-ratelimit-tokens-limit": "2000000",
        "anthropic-ratelimit-tokens-remaining": remaining.get("tokens", "1500000"),
        "anthropic-ratelimit-tokens-reset": "2026-01-01T00:00:15Z",
    }
    return h


ANTH_TAIL = (
    " For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the "
    "response headers for current usage. Please reduce the prompt length or the maximum tokens "
    "requested, or try again later."
)

# (id, status, headers, body, expected type, expected retry_after, too_large)
CASES = [
    (
        "openai-rpm",
        429,
        OPENAI_HEADERS,
        openai_error(
            "Rate limit reached for gpt-4o in organization org-x on requests per min (RPM): "
            "Limit 500, Used 500, Requested 1. Please try again in 120ms. " + OPENAI_TAIL,
            "requests",
            "rate_limit_exceeded",
        ),
        LimitType.REQUESTS,
        0.12,
        False,
    ),
    (
        "openai-tpm",
        429,
        {**OPENAI_HEADERS, "x-ratelimit-remaining-requests": "420"},
        openai_error(
            "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): "
            "Limit 30000, Used 29100, Requested 2000. Please try again in 1.8s. " + OPENAI_TAIL,
            "tokens",
            "rate_limit_exceeded",
        ),
        LimitType.TOKENS,
        1.8,
        False,
    ),
    (
        # the headers state a 30,000 TPM with room; the 429 names another per-minute token
        # limit (8,000): an output-token limit the headers do not describe
        "openai-tpm-other-limit",
        429,
        {**OPENAI_HEADERS, "x-ratelimit-remaining-requests": "420"},
        openai_error(
            "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): "
            "Limit 8000, Used 7900, Requested 300. Please try again in 1.8s. " + OPENAI_TAIL,
            "tokens",
            "rate_limit_exceeded",
        ),
        LimitType.OUTPUT_TOKENS,
        1.8,
        False,
    ),
    (
        # a daily limit other than the header's TPM is neither an output limit nor the TPM:
        # no per-minute budget ran out
        "openai-tpd-with-headers",
        429,
        {**OPENAI_HEADERS, "x-ratelimit-remaining-requests": "420"},
        openai_error(
            "Rate limit reached for gpt-4o-mini in organization org-x on tokens per day (TPD): "
            "Limit 2000000, Used 1999000, Requested 3000. Please try again in 6m0s.",
            "tokens",
            "rate_limit_exceeded",
        ),
        LimitType.DAILY,
        360.0,
        False,
    ),
    (
        "openai-tpd",
        429,
        {},
        openai_error(
            "Rate limit reached for gpt-4o-mini in organization org-x on tokens per day (TPD): "
            "Limit 2000000, Used 1999000, Requested 3000. Please try again in 6m0s.",
            "tokens",
            "rate_limit_exceeded",
        ),
        LimitType.DAILY,
        360.0,
        False,
    ),
    (
        "openai-rpd",
        429,
        OPENAI_HEADERS,
        openai_error(
            "Rate limit reached for gpt-4o in organization org-x on requests per day (RPD): "
            "Limit 10000, Used 10000, Requested 1. Please try again in 8.64s. " + OPENAI_TAIL,
            "requests",
            "rate_limit_exceeded",
        ),
        LimitType.DAILY,
        8.64,
        False,
    ),
    (
        "openai-too-large",
        429,
        {},
        openai_error(
            "Request too large for gpt-4o in organization org-x on tokens per min (TPM): "
            "Limit 30000, Requested 50000. The input or output tokens must be reduced in order "
            "to run successfully. Visit https://platform.openai.com/account/rate-limits to "
            "learn more.",
            "tokens",
            "rate_limit_exceeded",
        ),
        LimitType.TOKENS,
        None,
        True,
    ),
    (
        "openai-insufficient-quota",
        429,
        {},
        openai_error(
            "You exceeded your current quota, please check your plan and billing details. For "
            "more information on this error, read the docs: "
            "https://platform.openai.com/docs/guides/error-codes/api-errors.",
            "insufficient_quota",
            "insufficient_quota",
        ),
        LimitType.SPEND,
        None,
        False,
    ),
    (
        "openai-503",
        503,
        {"retry-after": "4"},
        openai_error("The server is overloaded or not ready yet.", "server_error", None),
        LimitType.OVERLOAD,
        4.0,
        False,
    ),
    (
        "openai-no-body-requests-at-zero",
        429,
        OPENAI_HEADERS,
        None,
        LimitType.REQUESTS,
        None,
        False,
    ),
    (
        "openai-no-body-tokens-at-zero",
        429,
        {
            **OPENAI_HEADERS,
            "x-ratelimit-remaining-requests": "400",
            "x-ratelimit-remaining-tokens": "0",
        },
        b"",
        LimitType.TOKENS,
        None,
        False,
    ),
    (
        "openai-mixed-case-headers-retry-after-ms",
        429,
        {"X-RateLimit-Remaining-Requests": "0", "Retry-After-Ms": "250"},
        "not json at all",
        LimitType.REQUESTS,
        0.25,
        False,
    ),
    ("bare-429", 429, {}, None, LimitType.UNKNOWN, None, False),
    ("success", 200, OPENAI_HEADERS, b'{"id": "x"}', LimitType.NONE, None, False),
    (
        "plain-400",
        400,
        {},
        openai_error("max_tokens is too large: 99999.", "invalid_request_error", None),
        LimitType.NONE,
        None,
        False,
    ),
    (
        "anthropic-input-tokens",
        429,
        {**anth_headers(input="0", tokens="0"), "retry-after": "15"},
        anthropic_error(
            "rate_limit_error",
            "This request would exceed the rate limit for your organization (org-1) of "
            "2,000,000 input tokens per minute." + ANTH_TAIL,
        ),
        LimitType.INPUT_TOKENS,
        15.0,
        False,
    ),
    (
        "anthropic-output-tokens",
        429,
        {**anth_headers(output="0"), "retry-after": "2"},
        anthropic_error(
            "rate_limit_error",
            "This request would exceed the rate limit for your organization (org-1) of "
            "400,000 output tokens per minute." + ANTH_TAIL,
        ),
        LimitType.OUTPUT_TOKENS,
        2.0,
        False,
    ),
    (
        "anthropic-requests",
        429,
        {**anth_headers(requests="0"), "retry-after": "1"},
        anthropic_error(
            "rate_limit_error",
            "This request would exceed your organization's rate limit of 4,000 requests per "
            "minute." + ANTH_TAIL,
        ),
        LimitType.REQUESTS,
        1.0,
        False,
    ),
    (
        "anthropic-legacy-request-tokens",
        429,
        {},
        anthropic_error(
            "rate_limit_error",
            "Number of request tokens has exceeded your per-minute rate limit "
            "(https://docs.anthropic.com/en/api/rate-limits); see the response headers for "
            "current usage. Please reduce the prompt length or the maximum tokens requested, "
            "or try again later.",
        ),
        LimitType.TOKENS,
        None,
        False,
    ),
    (
        "anthropic-ambiguous-input-at-zero",
        429,
        anth_headers(input="0", tokens="0"),
        anthropic_error("rate_limit_error", "Rate limited. Please slow down."),
        LimitType.INPUT_TOKENS,
        None,
        False,
    ),
    (
        "anthropic-ambiguous-two-at-zero-longest-reset",
        429,
        anth_headers(requests="0", output="0"),
        anthropic_error("rate_limit_error", "Rate limited."),
        LimitType.OUTPUT_TOKENS,  # resets at +2 s vs +1 s for requests
        None,
        False,
    ),
    (
        "anthropic-ambiguous-nothing-at-zero",
        429,
        anth_headers(),
        anthropic_error("rate_limit_error", "Rate limited."),
        LimitType.UNKNOWN,
        None,
        False,
    ),
    (
        "anthropic-529",
        529,
        {},
        anthropic_error("overloaded_error", "Overloaded"),
        LimitType.OVERLOAD,
        None,
        False,
    ),
    (
        "anthropic-credit-balance",
        400,
        {},
        anthropic_error(
            "invalid_request_error",
            "Your credit balance is too low to access the Anthropic API. Please go to Plans & "
            "Billing to upgrade or purchase credits.",
        ),
        LimitType.SPEND,
        None,
        False,
    ),
    (
        "anthropic-billing-error",
        402,
        {},
        anthropic_error("billing_error", "Payment required."),
        LimitType.SPEND,
        None,
        False,
    ),
    (
        "gateway-403-budget",
        403,
        {},
        {"error": {"message": "Budget has been exceeded for this key", "type": "auth_error"}},
        LimitType.SPEND,
        None,
        False,
    ),
    ("plain-503", 503, {}, "Service Unavailable", LimitType.OVERLOAD, None, False),
    ("plain-500", 500, {}, "Internal Server Error", LimitType.NONE, None, False),
]


@pytest.mark.parametrize(
    ("status", "headers", "body", "expected", "retry_after", "too_large"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_classify_table(
    status: int,
    headers: dict[str, str],
    body: bytes | str | Mapping[str, object] | None,
    expected: LimitType,
    retry_after: float | None,
    too_large: bool,
) -> None:
    c = classify(status, headers, body, now_epoch=EPOCH)
    assert c.limit_type is expected
    if retry_after is None:
        assert c.retry_after_s is None
    else:
        assert c.retry_after_s == pytest.approx(retry_after)
    assert c.too_large is too_large


@pytest.mark.parametrize("form", ["mapping", "str", "bytes"])
def test_body_forms_are_equivalent(form: str) -> None:
    obj = anthropic_error(
        "rate_limit_error",
        "This request would exceed the rate limit for your organization (o) of 80,000 output "
        "tokens per minute.",
    )
    body: object = {"mapping": obj, "str": json.dumps(obj), "bytes": json.dumps(obj).encode()}[form]
    c = classify(429, {}, body)  # type: ignore[arg-type]
    assert c.limit_type is LimitType.OUTPUT_TOKENS
    assert c.provider == "anthropic"
    assert c.is_throttle


def test_headers_are_parsed_per_class() -> None:
    c = classify(429, OPENAI_HEADERS, None)
    assert c.provider == "openai"
    assert c.limits == {LimitType.REQUESTS: 500, LimitType.TOKENS: 30000}
    assert c.remaining == {LimitType.REQUESTS: 0, LimitType.TOKENS: 29100}
    assert c.resets_s == {LimitType.REQUESTS: 0.12, LimitType.TOKENS: 1.8}


def test_anthropic_resets_need_the_epoch() -> None:
    h = anth_headers()
    without = parse_rate_limit_headers(h)
    assert without.resets_s == {} and without.reset_at[LimitType.INPUT_TOKENS] == EPOCH + 15
    with_now = parse_rate_limit_headers(h, now_epoch=EPOCH + 5)
    assert with_now.resets_s[LimitType.INPUT_TOKENS] == pytest.approx(10.0)
    assert with_now.limits[LimitType.OUTPUT_TOKENS] == 400000


def test_retry_after_http_date() -> None:
    h = {"retry-after": "Thu, 01 Jan 2026 00:00:30 GMT"}
    assert classify(429, h, None, now_epoch=EPOCH).retry_after_s == pytest.approx(30.0)
    assert classify(429, h, None).retry_after_s is None  # no clock, no guess


def test_spend_and_overload_are_not_throttles() -> None:
    spend = classify(429, {}, openai_error("quota", "insufficient_quota", "insufficient_quota"))
    assert not spend.is_throttle
    assert not classify(529, {}, None).is_throttle
    daily = classify(429, {}, openai_error("on requests per day (RPD): Limit 10", "requests", None))
    assert daily.limit_type is LimitType.DAILY and not daily.is_throttle
    assert classify(429, {}, None).is_throttle  # unknown: cut everything


@pytest.mark.parametrize("text", ["", "abc", "5x", "m5", "1.2.3s"])
def test_bad_go_durations(text: str) -> None:
    assert parse_go_duration(text) is None


def test_a_token_429_naming_another_limit_states_it_as_the_output_limit() -> None:
    body = openai_error(
        "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): "
        "Limit 8000, Used 7900, Requested 300. Please try again in 1.8s. " + OPENAI_TAIL,
        "tokens",
        "rate_limit_exceeded",
    )
    c = classify(429, OPENAI_HEADERS, body, now_epoch=EPOCH)
    assert c.limits == {
        LimitType.REQUESTS: 500.0,
        LimitType.TOKENS: 30000.0,
        LimitType.OUTPUT_TOKENS: 8000.0,
    }
    assert c.remaining == {LimitType.REQUESTS: 0.0, LimitType.TOKENS: 29100.0}
    within = json.loads(json.dumps(body).replace("Limit 8000", "Limit 30300"))
    same = classify(429, OPENAI_HEADERS, within, now_epoch=EPOCH)
    assert same.limit_type is LimitType.TOKENS  # within 2% of the header: the same limit
    assert LimitType.OUTPUT_TOKENS not in same.limits


# Whatever a provider (or a proxy in front of it) puts in its headers and body, the reading is
# a LimitType with finite numbers: a limit > 0, a remaining and a wait >= 0. A header limit of
# "0" or "-5" would otherwise cap a budget at nothing, and "1e400" or "nan" become a wait of
# forever or a NaN that every comparison after it gets wrong.
_HEADER_NAMES = [
    "retry-after",
    "retry-after-ms",
    *(
        f"x-ratelimit-{kind}-{what}"
        for kind in ("limit", "remaining", "reset")
        for what in ("requests", "tokens")
    ),
    *(
        f"anthropic-ratelimit-{what}-{kind}"
        for what in ("requests", "tokens", "input-tokens", "output-tokens")
        for kind in ("limit", "remaining", "reset")
    ),
]
_ODD_VALUES = ["", "-1", "0", "1e400", "nan", "-inf", "1m30.5s", "2026-13-45T99:99:99Z", "9" * 400]
_values = st.one_of(
    st.text(max_size=30),
    st.sampled_from(_ODD_VALUES),
    st.integers(-(10**30), 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(str),
)
_bodies = st.one_of(
    st.none(),
    st.binary(max_size=200),
    st.text(max_size=200),
    st.builds(
        lambda etype, message: {"type": "error", "error": {"type": etype, "message": message}},
        st.sampled_from(["rate_limit_error", "overloaded_error", "tokens", "requests", None, 5]),
        st.one_of(st.text(max_size=80), st.none(), st.integers()),
    ),
)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(
    status=st.sampled_from([200, 400, 402, 403, 413, 429, 500, 503, 529]),
    headers=st.dictionaries(st.sampled_from(_HEADER_NAMES), _values, max_size=8),
    body=_bodies,
    now=st.one_of(st.none(), st.floats(0, 4e9)),
)
@example(status=200, headers={"x-ratelimit-limit-requests": "1E400"}, body=None, now=None)
@example(status=429, headers={"retry-after": "nan"}, body=None, now=None)
@example(status=429, headers={"anthropic-ratelimit-tokens-limit": "0"}, body=None, now=None)
@example(status=429, headers={"x-ratelimit-reset-tokens": "9" * 400 + "s"}, body=None, now=1.0)
@example(status=429, headers={"x-ratelimit-remaining-tokens": "-3"}, body=None, now=None)
def test_any_headers_and_body_read_as_finite_numbers(
    status: int, headers: dict[str, str], body: object, now: float | None
) -> None:
    c = classify(status, headers, body, now_epoch=now)  # type: ignore[arg-type]
    assert isinstance(c.limit_type, LimitType)
    assert c.retry_after_s is None or (math.isfinite(c.retry_after_s) and c.retry_after_s >= 0)
    assert all(math.isfinite(v) and v > 0 for v in c.limits.values()), c.limits
    assert all(math.isfinite(v) and v >= 0 for v in c.remaining.values()), c.remaining
    assert all(math.isfinite(v) and v >= 0 for v in c.resets_s.values()), c.resets_s
