"""What the simulated provider puts on the wire: rate-limit headers and error responses.

OpenAI: ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` with Go-style durations
("6m0s", "120ms") and 429 bodies ``{"error": {"type": "requests"|"tokens",
"code": "rate_limit_exceeded", "message": "... on tokens per min (TPM): Limit L, Used U,
Requested R. Please try again in 1.2s ..."}}``; ``insufficient_quota`` 429 for spend; 503 when
overloaded. Anthropic: ``anthropic-ratelimit-{requests,input-tokens,output-tokens,tokens}-
{limit,remaining,reset}`` with RFC 3339 resets, 429 ``rate_limit_error`` naming the limit
("... N input tokens per minute ..."), 400 credit-balance error for spend, 529
``overloaded_error``. ``retry-after`` (whole seconds, rounded up) on every 429/529/503,
``retry-after-ms`` too on OpenAI's. The values come from a ``sim.limits.LimitsSnapshot``.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

from starlette.responses import JSONResponse

from planner.classify import LimitType
from sim.limits import LimitsSnapshot, ProviderAdmission

_OPENAI = {LimitType.REQUESTS: "requests", LimitType.TOKENS: "tokens"}
_ANTHROPIC = {
    LimitType.REQUESTS: "requests",
    LimitType.INPUT_TOKENS: "input-tokens",
    LimitType.OUTPUT_TOKENS: "output-tokens",
    LimitType.TOKENS: "tokens",
}
_OPENAI_NAMES = {
    LimitType.REQUESTS: "requests per min (RPM)",
    LimitType.TOKENS: "tokens per min (TPM)",
}
_ANTHROPIC_NAMES = {
    LimitType.REQUESTS: "requests per minute",
    LimitType.INPUT_TOKENS: "input tokens per minute",
    LimitType.OUTPUT_TOKENS: "output tokens per minute",
    LimitType.TOKENS: "tokens per minute",
}


def go_duration(seconds: float) -> str:
    """Seconds as a Go duration the way OpenAI writes them: "120ms", "1.5s", "6m0s"."""
    if seconds < 1:
        return f"{max(0, math.ceil(seconds * 1000))}ms"
    if seconds < 60:
        return f"{round(seconds, 3):g}s"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{round(rest, 3):g}s"


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def rate_limit_headers(flavour: str, snap: LimitsSnapshot, now_epoch: float) -> dict[str, str]:
    """The provider's rate-limit headers for the current bucket levels."""
    headers: dict[str, str] = {}
    if flavour == "openai":
        for cls, name in _OPENAI.items():
            c = snap.classes.get(cls)
            if c is None:
                continue
            headers[f"x-ratelimit-limit-{name}"] = str(int(c.limit))
            headers[f"x-ratelimit-remaining-{name}"] = str(int(c.remaining))
            headers[f"x-ratelimit-reset-{name}"] = go_duration(c.reset_s)
        return headers
    combined: tuple[float, float, float] | None = None
    for cls, name in _ANTHROPIC.items():
        c = snap.classes.get(cls)
        if c is None:
            continue
        headers[f"anthropic-ratelimit-{name}-limit"] = str(int(c.limit))
        headers[f"anthropic-ratelimit-{name}-remaining"] = str(int(c.remaining))
        headers[f"anthropic-ratelimit-{name}-reset"] = rfc3339(now_epoch + c.reset_s)
        if cls in (LimitType.INPUT_TOKENS, LimitType.OUTPUT_TOKENS) and (
            combined is None or c.remaining < combined[1]
        ):
            combined = (c.limit, c.remaining, c.reset_s)
    if combined is not None and LimitType.TOKENS not in snap.classes:
        # Anthropic's tokens-* headers state the most restrictive token limit in effect.
        headers["anthropic-ratelimit-tokens-limit"] = str(int(combined[0]))
        headers["anthropic-ratelimit-tokens-remaining"] = str(int(combined[1]))
        headers["anthropic-ratelimit-tokens-reset"] = rfc3339(now_epoch + combined[2])
    return headers


def _retry_headers(seconds: float, flavour: str) -> dict[str, str]:
    out = {"retry-after": str(max(1, math.ceil(seconds)))}
    if flavour == "openai":
        out["retry-after-ms"] = str(max(1, math.ceil(seconds * 1000)))
    return out


def rate_limited(
    flavour: str, admission: ProviderAdmission, snap: LimitsSnapshot, now_epoch: float
) -> JSONResponse:
    """The 429 for a rejected admission, naming the limit that was hit."""
    cls = admission.limit or LimitType.REQUESTS
    headers = {
        **rate_limit_headers(flavour, snap, now_epoch),
        **_retry_headers(admission.retry_after_s, flavour),
    }
    c = snap.classes.get(cls)
    limit = int(c.limit) if c is not None else 0
    used = max(0, limit - int(c.remaining)) if c is not None else 0
    if flavour == "openai":
        what = _OPENAI_NAMES.get(cls, "tokens per min (TPM)")
        if admission.too_large:
            message = (
                f"Request too large for sim-gpt on {what}: Limit {limit}, "
                f"Requested {int(admission.requested)}."
            )
        else:
            message = (
                f"Rate limit reached for sim-gpt in organization org-sim on {what}: Limit "
                f"{limit}, Used {used}, Requested {int(admission.requested)}. Please try again "
                f"in {go_duration(admission.retry_after_s)}."
            )
        body = {
            "error": {
                "message": message,
                "type": _OPENAI.get(cls, "tokens"),
                "param": None,
                "code": "rate_limit_exceeded",
            }
        }
        return JSONResponse(body, status_code=429, headers=headers)
    what = _ANTHROPIC_NAMES.get(cls, "tokens per minute")
    message = (
        f"This request would exceed the rate limit for your organization (org-sim) of {limit} "
        f"{what}. For details, refer to: https://docs.claude.com/en/api/rate-limits."
    )
    body_a = {"type": "error", "error": {"type": "rate_limit_error", "message": message}}
    return JSONResponse(body_a, status_code=429, headers=headers)


def spend_error(flavour: str, snap: LimitsSnapshot, now_epoch: float) -> JSONResponse:
    """The key's spend cap is used up."""
    headers = rate_limit_headers(flavour, snap, now_epoch)
    if flavour == "openai":
        body = {
            "error": {
                "message": "You exceeded your current quota, please check your plan and "
                "billing details.",
                "type": "insufficient_quota",
                "param": None,
                "code": "insufficient_quota",
            }
        }
        return JSONResponse(body, status_code=429, headers=headers)
    body_a = {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "Your credit balance is too low to access the Anthropic API. Please go "
            "to Plans & Billing to upgrade or purchase credits.",
        },
    }
    return JSONResponse(body_a, status_code=400, headers=headers)


def overloaded(flavour: str, retry_after_s: float = 1.0) -> JSONResponse:
    """Overloaded: Anthropic 529 ``overloaded_error``; OpenAI 503."""
    headers = _retry_headers(retry_after_s, flavour)
    if flavour == "openai":
        body = {
            "error": {
                "message": "The server is overloaded or not ready yet.",
                "type": "server_error",
                "param": None,
                "code": None,
            }
        }
        return JSONResponse(body, status_code=503, headers=headers)
    body_a = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    return JSONResponse(body_a, status_code=529, headers=headers)


def auth_error(flavour: str) -> JSONResponse:
    """401 for a missing, unknown, revoked or expired key (the key is never echoed)."""
    if flavour == "openai":
        body = {
            "error": {
                "message": "Incorrect API key provided.",
                "type": "invalid_request_error",
                "param": None,
                "code": "invalid_api_key",
            }
        }
        return JSONResponse(body, status_code=401)
    body_a = {
        "type": "error",
        "error": {"type": "authentication_error", "message": "invalid x-api-key"},
    }
    return JSONResponse(body_a, status_code=401)


def invalid_request(flavour: str, message: str) -> JSONResponse:
    if flavour == "openai":
        body = {
            "error": {
                "message": message,
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        }
        return JSONResponse(body, status_code=400)
    body_a = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    return JSONResponse(body_a, status_code=400)
