"""Provider wire format: the rate-limit headers and error bodies OpenAI and Anthropic send.

The simulated provider HTTP server renders its responses with this module from a limits
snapshot or a rejection of ``sim.limits``, so that what the gateway reads (through
``planner.classify``) has the real shapes:
- OpenAI: ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (resets as Go durations,
  "6m0s", "120ms"); one token limit is revealed (the combined class, else input, else output);
  429 bodies ``{"error": {"message": "Rate limit reached for ... on requests per min (RPM): ...",
  "type": "requests"|"tokens", "param": null, "code": "rate_limit_exceeded"}}``, "Request too
  large ..." for a request above the limit, ``insufficient_quota`` for spend, 503 for overload.
- Anthropic: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,remaining,
  reset}`` (RFC 3339 resets; ``tokens`` is the most restrictive token class), ``retry-after`` in
  whole seconds; 429 ``rate_limit_error`` naming requests / input tokens / output tokens per
  minute; 529 ``overloaded_error``; 400 "Your credit balance is too low" for spend.
- "none": no rate-limit headers, no retry-after, a 429 that names no limit.

Pure: the wall-clock epoch for RFC 3339 resets is an argument.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from planner.classify import LimitType
from sim.limits import ClassSnapshot, LimitsSnapshot, ProviderAdmission

__all__ = [
    "RenderedResponse",
    "Style",
    "go_duration",
    "rate_limit_headers",
    "render_overload",
    "render_rejection",
    "render_spend",
    "rfc3339",
]

Style = Literal["openai", "anthropic", "none"]
STYLES: tuple[Style, ...] = ("openai", "anthropic", "none")

_OPENAI_DOCS = "Visit https://platform.openai.com/account/rate-limits to learn more."
_ANTHROPIC_TAIL = (
    "For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the "
    "response headers for current usage. Please reduce the prompt length or the maximum tokens "
    "requested, or try again later. You may also contact sales at "
    "https://www.anthropic.com/contact-sales to discuss your options for a rate limit increase."
)


@dataclass(frozen=True)
class RenderedResponse:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> object:
        return json.loads(self.body)


def _check_style(style: str) -> Style:
    if style not in STYLES:
        raise ValueError(f"provider header style must be one of {STYLES}, got {style!r}")
    return style


def _fmt(value: float) -> str:
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return text or "0"


def go_duration(seconds: float) -> str:
    """Format seconds like Go's ``time.Duration.String`` (rounded to the microsecond)."""
    if seconds <= 0:
        return "0s"
    us = round(seconds * 1e6)
    if us == 0:
        return "0s"
    if us < 1000:
        return f"{us}µs"
    if us < 1_000_000:
        return f"{_fmt(us / 1000)}ms"
    hours, rest = divmod(us, 3_600_000_000)
    minutes, rest = divmod(rest, 60_000_000)
    secs = _fmt(rest / 1e6)
    if hours:
        return f"{hours}h{minutes}m{secs}s"
    if minutes:
        return f"{minutes}m{secs}s"
    return f"{secs}s"


def rfc3339(epoch: float) -> str:
    """UTC RFC 3339 with whole seconds, rounded up (a reset is never announced early)."""
    return datetime.fromtimestamp(math.ceil(epoch), tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _openai_token_class(snapshot: LimitsSnapshot) -> LimitType | None:
    for cls in (LimitType.TOKENS, LimitType.INPUT_TOKENS, LimitType.OUTPUT_TOKENS):
        if cls in snapshot.classes:
            return cls
    return None


def _anthropic_tokens(snapshot: LimitsSnapshot) -> ClassSnapshot | None:
    if LimitType.TOKENS in snapshot.classes:
        return snapshot.classes[LimitType.TOKENS]
    candidates = [
        snapshot.classes[c]
        for c in (LimitType.INPUT_TOKENS, LimitType.OUTPUT_TOKENS)
        if c in snapshot.classes
    ]
    if not candidates:
        return None
    return min(candidates, key=lambda s: s.remaining / s.limit)


def _count(value: float) -> str:
    return str(max(0, int(value)))


def rate_limit_headers(style: str, snapshot: LimitsSnapshot, now_epoch: float) -> dict[str, str]:
    """The rate-limit headers a response of ``style`` carries for this snapshot."""
    style = _check_style(style)
    headers: dict[str, str] = {}
    if style == "openai":
        pairs = [("requests", snapshot.classes.get(LimitType.REQUESTS))]
        tok = _openai_token_class(snapshot)
        pairs.append(("tokens", snapshot.classes[tok] if tok is not None else None))
        for name, snap in pairs:
            if snap is None:
                continue
            headers[f"x-ratelimit-limit-{name}"] = _count(snap.limit)
            headers[f"x-ratelimit-remaining-{name}"] = _count(snap.remaining)
            headers[f"x-ratelimit-reset-{name}"] = go_duration(snap.reset_s)
    elif style == "anthropic":
        anth = [
            ("requests", snapshot.classes.get(LimitType.REQUESTS)),
            ("tokens", _anthropic_tokens(snapshot)),
            ("input-tokens", snapshot.classes.get(LimitType.INPUT_TOKENS)),
            ("output-tokens", snapshot.classes.get(LimitType.OUTPUT_TOKENS)),
        ]
        for name, snap in anth:
            if snap is None:
                continue
            headers[f"anthropic-ratelimit-{name}-limit"] = _count(snap.limit)
            headers[f"anthropic-ratelimit-{name}-remaining"] = _count(snap.remaining)
            headers[f"anthropic-ratelimit-{name}-reset"] = rfc3339(now_epoch + snap.reset_s)
    return headers


def _json(obj: object) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode()


def _retry_after(seconds: float) -> str:
    return str(max(1, math.ceil(seconds)))


def _anthropic_what(cls: LimitType) -> str:
    return {
        LimitType.REQUESTS: "requests",
        LimitType.INPUT_TOKENS: "input tokens",
        LimitType.OUTPUT_TOKENS: "output tokens",
    }.get(cls, "tokens")


def render_rejection(
    style: str,
    rejection: ProviderAdmission,
    snapshot: LimitsSnapshot,
    now_epoch: float,
    *,
    model: str = "gpt-4o",
    org: str = "org-sim",
) -> RenderedResponse:
    """The 429 a provider of ``style`` sends for a rejection of ``ProviderLimits.admit``."""
    style = _check_style(style)
    if rejection.admitted or rejection.limit is None:
        raise ValueError("render_rejection needs a rejected admission")
    cls = rejection.limit
    wait = rejection.retry_after_s
    headers = rate_limit_headers(style, snapshot, now_epoch)
    snap = snapshot.classes.get(cls)
    limit = int(snap.limit) if snap is not None else 0
    used = int(snap.limit - snap.remaining) if snap is not None else 0
    requested = int(rejection.requested)
    if style == "none":
        body = _json({"error": {"message": "Too Many Requests", "type": "rate_limit_error"}})
        return RenderedResponse(429, headers, body)
    headers["retry-after"] = _retry_after(wait)
    if style == "openai":
        if cls is LimitType.REQUESTS:
            what, etype = "requests per min (RPM)", "requests"
        else:
            what, etype = "tokens per min (TPM)", "tokens"
        if rejection.too_large:
            message = (
                f"Request too large for {model} in organization {org} on {what}: "
                f"Limit {limit}, Requested {requested}. The input or output tokens must be "
                f"reduced in order to run successfully. {_OPENAI_DOCS}"
            )
        else:
            message = (
                f"Rate limit reached for {model} in organization {org} on {what}: "
                f"Limit {limit}, Used {used}, Requested {requested}. "
                f"Please try again in {go_duration(wait)}. {_OPENAI_DOCS}"
            )
        body = _json(
            {
                "error": {
                    "message": message,
                    "type": etype,
                    "param": None,
                    "code": "rate_limit_exceeded",
                }
            }
        )
        return RenderedResponse(429, headers, body)
    message = (
        f"This request would exceed the rate limit for your organization ({org}) of "
        f"{limit:,} {_anthropic_what(cls)} per minute. {_ANTHROPIC_TAIL}"
    )
    body = _json({"type": "error", "error": {"type": "rate_limit_error", "message": message}})
    return RenderedResponse(429, headers, body)


def render_overload(style: str, retry_after_s: float | None = None) -> RenderedResponse:
    """Anthropic 529 ``overloaded_error``; OpenAI (and "none") 503."""
    style = _check_style(style)
    headers = {} if retry_after_s is None else {"retry-after": _retry_after(retry_after_s)}
    if style == "anthropic":
        body = _json(
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
        )
        return RenderedResponse(529, headers, body)
    if style == "openai":
        body = _json(
            {
                "error": {
                    "message": "The server is overloaded or not ready yet.",
                    "type": "server_error",
                    "param": None,
                    "code": None,
                }
            }
        )
        return RenderedResponse(503, headers, body)
    return RenderedResponse(503, headers, _json({"error": {"message": "Service Unavailable"}}))


def render_spend(style: str) -> RenderedResponse:
    """Out of credit / over the spend cap: OpenAI 429 ``insufficient_quota``, Anthropic 400
    credit balance, "none" 402."""
    style = _check_style(style)
    if style == "openai":
        body = _json(
            {
                "error": {
                    "message": "You exceeded your current quota, please check your plan and "
                    "billing details. For more information on this error, read the docs: "
                    "https://platform.openai.com/docs/guides/error-codes/api-errors.",
                    "type": "insufficient_quota",
                    "param": None,
                    "code": "insufficient_quota",
                }
            }
        )
        return RenderedResponse(429, {}, body)
    if style == "anthropic":
        body = _json(
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "Your credit balance is too low to access the Anthropic API. "
                    "Please go to Plans & Billing to upgrade or purchase credits.",
                },
            }
        )
        return RenderedResponse(400, {}, body)
    return RenderedResponse(402, {}, _json({"error": {"message": "Spend cap reached"}}))
