"""The 429 classifier: which provider limit a failed (or successful) LLM call ran into.

It owns the reading of provider responses — status, rate-limit headers and error bodies of
OpenAI and Anthropic — into one frozen ``Classification``: the limit type that was hit, the
limits/remaining/resets the headers state per limit class, the retry-after, and whether the
request can never fit (``too_large``). The budget controller cuts only the budget whose limit
was hit, so telling a request-count 429 from a token 429 is the point of this module; a 429 of
a per-day limit (OpenAI's RPD/TPD) is ``DAILY``, which cuts no per-minute budget.

Pure: no clock reads (RFC 3339 resets need ``now_epoch`` passed in), no I/O.

Header limits are stated per the provider's window (per minute for RPM/TPM limits) and are
returned as stated; ``resets_s`` are seconds from ``now_epoch``.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum

__all__ = [
    "Classification",
    "LimitType",
    "RateLimitHeaders",
    "classify",
    "parse_go_duration",
    "parse_rate_limit_headers",
]


class LimitType(StrEnum):
    """What a response says was exhausted. ``NONE``: the response is not a limit error."""

    REQUESTS = "requests"
    INPUT_TOKENS = "input_tokens"
    OUTPUT_TOKENS = "output_tokens"
    TOKENS = "tokens"
    SPEND = "spend"
    OVERLOAD = "overload"
    # a per-day limit (OpenAI's RPD/TPD): not a per-minute budget's, so none is cut; launches
    # back off, as for an overload
    DAILY = "daily"
    UNKNOWN = "unknown"
    NONE = "none"


# The rate-limit classes a header can describe (a subset of LimitType).
_RATE_CLASSES = (
    LimitType.REQUESTS,
    LimitType.TOKENS,
    LimitType.INPUT_TOKENS,
    LimitType.OUTPUT_TOKENS,
)

_GO_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
_GO_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|us|µs|ns|h|m|s)")


def parse_go_duration(text: str) -> float | None:
    """Parse a Go-style duration ("6m0s", "1s", "120ms", "0.5s", "1h2m3.5s") into seconds.

    A bare number is taken as seconds. Returns None for text that is not a duration, and for
    one that is not a finite number of seconds >= 0 (a header is the provider's text: "nan",
    "-5" or 400 nines must not become a wait).
    """
    s = text.strip()
    if not s:
        return None
    try:
        bare = float(s)
    except ValueError:
        pass
    else:
        return bare if math.isfinite(bare) and bare >= 0 else None
    pos = 0
    total = 0.0
    for m in _GO_PART.finditer(s):
        if m.start() != pos:
            return None
        total += float(m.group(1)) * _GO_UNITS[m.group(2)]
        pos = m.end()
    if pos != len(s) or pos == 0 or not math.isfinite(total):
        return None
    return total


def _parse_number(text: str) -> float | None:
    """A header's number, or None where it is none or not finite ("nan", "inf", "1e400")."""
    try:
        value = float(text.strip().replace(",", ""))
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _stated_limit(text: str | None) -> float | None:
    """A header's limit: a finite number > 0 (0 or less states no limit: a budget capped there
    would admit nothing, ever)."""
    value = None if text is None else _parse_number(text)
    return value if value is not None and value > 0 else None


def _stated_remaining(text: str | None) -> float | None:
    """A header's remaining: a finite number, below 0 read as an empty bucket."""
    value = None if text is None else _parse_number(text)
    return None if value is None else max(value, 0.0)


def _parse_rfc3339(text: str) -> float | None:
    s = text.strip()
    if s.endswith(("Z", "z")):
        s = s[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(s)
    except ValueError:
        return None
    if dt.tzinfo is None:
        return None
    return dt.timestamp()


@dataclass(frozen=True)
class RateLimitHeaders:
    """What rate-limit headers state, per limit class (keys are rate ``LimitType`` values).

    ``limits`` and ``remaining`` are as stated (per the provider's window, per minute for
    RPM/TPM); ``resets_s`` are seconds from ``now_epoch`` until the class is replenished
    (Anthropic's RFC 3339 resets are only converted when ``now_epoch`` is given, and are also
    kept as epochs in ``reset_at``). ``style`` is "openai", "anthropic" or "none".
    """

    style: str = "none"
    limits: Mapping[LimitType, float] = field(default_factory=dict)
    remaining: Mapping[LimitType, float] = field(default_factory=dict)
    resets_s: Mapping[LimitType, float] = field(default_factory=dict)
    reset_at: Mapping[LimitType, float] = field(default_factory=dict)
    retry_after_s: float | None = None


_OPENAI_SUFFIX = {
    "requests": LimitType.REQUESTS,
    "tokens": LimitType.TOKENS,
}
_ANTHROPIC_PREFIX = {
    "requests": LimitType.REQUESTS,
    "tokens": LimitType.TOKENS,
    "input-tokens": LimitType.INPUT_TOKENS,
    "output-tokens": LimitType.OUTPUT_TOKENS,
}


def _lower(headers: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in headers.items()}


def _retry_after(h: Mapping[str, str], now_epoch: float | None) -> float | None:
    ms = h.get("retry-after-ms")
    if ms is not None:
        v = _parse_number(ms)
        if v is not None and v >= 0:
            return v / 1000.0
    ra = h.get("retry-after")
    if ra is None:
        return None
    v = _parse_number(ra)
    if v is not None:
        return max(v, 0.0)
    if now_epoch is None:
        return None
    try:
        dt = parsedate_to_datetime(ra)
    except (TypeError, ValueError):
        return None
    return max(dt.timestamp() - now_epoch, 0.0)


def parse_rate_limit_headers(
    headers: Mapping[str, str], now_epoch: float | None = None
) -> RateLimitHeaders:
    """Read OpenAI ``x-ratelimit-*`` and Anthropic ``anthropic-ratelimit-*`` headers."""
    h = _lower(headers)
    limits: dict[LimitType, float] = {}
    remaining: dict[LimitType, float] = {}
    resets: dict[LimitType, float] = {}
    reset_at: dict[LimitType, float] = {}
    style = "none"
    for suffix, cls in _OPENAI_SUFFIX.items():
        lim = h.get(f"x-ratelimit-limit-{suffix}")
        rem = h.get(f"x-ratelimit-remaining-{suffix}")
        rst = h.get(f"x-ratelimit-reset-{suffix}")
        if (v := _stated_limit(lim)) is not None:
            limits[cls] = v
            style = "openai"
        if (v := _stated_remaining(rem)) is not None:
            remaining[cls] = v
            style = "openai"
        if rst is not None and (d := parse_go_duration(rst)) is not None:
            resets[cls] = d
            if now_epoch is not None:
                reset_at[cls] = now_epoch + d
    for prefix, cls in _ANTHROPIC_PREFIX.items():
        lim = h.get(f"anthropic-ratelimit-{prefix}-limit")
        rem = h.get(f"anthropic-ratelimit-{prefix}-remaining")
        rst = h.get(f"anthropic-ratelimit-{prefix}-reset")
        if (v := _stated_limit(lim)) is not None:
            limits[cls] = v
            style = "anthropic"
        if (v := _stated_remaining(rem)) is not None:
            remaining[cls] = v
            style = "anthropic"
        if rst is not None and (at := _parse_rfc3339(rst)) is not None:
            reset_at[cls] = at
            if now_epoch is not None:
                resets[cls] = max(at - now_epoch, 0.0)
    return RateLimitHeaders(
        style=style,
        limits=limits,
        remaining=remaining,
        resets_s=resets,
        reset_at=reset_at,
        retry_after_s=_retry_after(h, now_epoch),
    )


@dataclass(frozen=True)
class Classification:
    """The reading of one response. ``limits``/``remaining``/``resets_s`` as in headers."""

    status: int
    limit_type: LimitType
    provider: str = "none"
    limits: Mapping[LimitType, float] = field(default_factory=dict)
    remaining: Mapping[LimitType, float] = field(default_factory=dict)
    resets_s: Mapping[LimitType, float] = field(default_factory=dict)
    retry_after_s: float | None = None
    too_large: bool = False
    error_type: str | None = None
    error_code: str | None = None
    message: str = ""

    @property
    def is_throttle(self) -> bool:
        """A rate-limit rejection (a budget may need a cut), not spend or overload."""
        return self.limit_type in _RATE_CLASSES or self.limit_type is LimitType.UNKNOWN


def _decode_body(body: bytes | str | Mapping[str, object] | None) -> tuple[dict[str, object], str]:
    if body is None:
        return {}, ""
    if isinstance(body, Mapping):
        return dict(body), ""
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    try:
        parsed = json.loads(text)
    except ValueError:
        return {}, text
    if isinstance(parsed, dict):
        return parsed, ""
    return {}, text


def _error_fields(obj: Mapping[str, object], raw: str) -> tuple[str | None, str | None, str]:
    err = obj.get("error")
    etype: str | None = None
    code: str | None = None
    message = raw
    if isinstance(err, Mapping):
        t = err.get("type")
        c = err.get("code")
        m = err.get("message")
        etype = t if isinstance(t, str) else None
        code = c if isinstance(c, str) else None
        message = m if isinstance(m, str) else ""
    elif isinstance(err, str):
        message = err
    elif isinstance(obj.get("message"), str):
        message = str(obj["message"])
    return etype, code, message


_SPEND_WORDS = re.compile(
    r"credit balance|exceeded your current quota|insufficient[_ ]quota|billing|spend(ing)? "
    r"(limit|cap)|budget|usage limit|quota exceeded|payment",
    re.IGNORECASE,
)
_SPEND_TYPES = ("insufficient_quota", "billing_error", "billing_hard_limit_reached")
_OVERLOAD_TYPES = ("overloaded_error", "server_is_overloaded")
_OVERLOAD_WORDS = re.compile(r"overloaded|server is overloaded|capacity", re.IGNORECASE)
_RETRY_IN = re.compile(
    r"try again in\s+((?:\d+(?:\.\d*)?|\.\d+)(?:ms|us|µs|ns|h|m|s)"
    r"(?:(?:\d+(?:\.\d*)?|\.\d+)(?:ms|us|µs|ns|h|m|s))*)",
    re.IGNORECASE,
)
_RETRY_IN_SECONDS = re.compile(r"try again in\s+(\d+(?:\.\d+)?)\s*seconds?", re.IGNORECASE)


_MSG_PATTERNS = (
    (re.compile(r"input[ _]tokens per|\(itpm\)"), LimitType.INPUT_TOKENS),
    (re.compile(r"output[ _]tokens per|\(otpm\)"), LimitType.OUTPUT_TOKENS),
    (re.compile(r"tokens per|\(tpm\)|request tokens"), LimitType.TOKENS),
    (re.compile(r"requests per|\(rpm\)|number of requests"), LimitType.REQUESTS),
)
#: A per-day limit named in a 429's message: "... on tokens per day (TPD): Limit 2000000 ...".
_PER_DAY = re.compile(r"\bper day\b|\((?:tpd|rpd)\)", re.IGNORECASE)


def _type_from_message(message: str) -> LimitType | None:
    """The limit a message names ("... of 400,000 input tokens per minute", "(RPM)")."""
    m = message.lower()
    for pattern, limit_type in _MSG_PATTERNS:
        if pattern.search(m):
            return limit_type
    return None


def _from_remaining(hdrs: RateLimitHeaders) -> LimitType:
    """The class at 0 remaining; else the clearly lowest share below 10%; else unknown."""
    zero = [c for c in _RATE_CLASSES if c in hdrs.remaining and hdrs.remaining[c] <= 0]
    # Anthropic's combined "tokens" header mirrors the most restrictive token class: prefer
    # the specific class when both are at zero.
    if LimitType.TOKENS in zero and len(zero) > 1:
        specific = [c for c in zero if c in (LimitType.INPUT_TOKENS, LimitType.OUTPUT_TOKENS)]
        if specific:
            zero = [c for c in zero if c is not LimitType.TOKENS]
    if len(zero) == 1:
        return zero[0]
    if len(zero) > 1:
        with_reset = [c for c in zero if c in hdrs.resets_s]
        if len(with_reset) == len(zero):
            longest = max(with_reset, key=lambda c: hdrs.resets_s[c])
            if sum(1 for c in with_reset if hdrs.resets_s[c] == hdrs.resets_s[longest]) == 1:
                return longest
        return LimitType.UNKNOWN
    shares = {
        c: hdrs.remaining[c] / hdrs.limits[c]
        for c in _RATE_CLASSES
        if c in hdrs.remaining and hdrs.limits.get(c, 0) > 0
    }
    low = sorted((s, c) for c, s in shares.items() if s < 0.1)
    if len(low) == 1 or (len(low) > 1 and low[0][0] < low[1][0]):
        return low[0][1]
    return LimitType.UNKNOWN


def classify(
    status: int,
    headers: Mapping[str, str],
    body: bytes | str | Mapping[str, object] | None,
    *,
    now_epoch: float | None = None,
) -> Classification:
    """Classify one provider response (any status; 2xx → ``LimitType.NONE``)."""
    hdrs = parse_rate_limit_headers(headers, now_epoch)
    obj, raw = _decode_body(body)
    etype, code, message = _error_fields(obj, raw)
    top_type = obj.get("type")
    provider = hdrs.style
    if provider == "none":
        if top_type == "error":
            provider = "anthropic"
        elif isinstance(obj.get("error"), Mapping):
            provider = "openai"

    retry_after = hdrs.retry_after_s
    if retry_after is None and message:
        m = _RETRY_IN.search(message)
        if m is not None:
            retry_after = parse_go_duration(m.group(1))
        else:
            m2 = _RETRY_IN_SECONDS.search(message)
            if m2 is not None:
                retry_after = float(m2.group(1))

    too_large = "request too large" in message.lower()
    limit_type = _decide(status, etype, code, message, hdrs)
    limits = dict(hdrs.limits)
    if limit_type is LimitType.TOKENS and provider == "openai":
        limit_type, limits = _other_token_limit(message, limits)

    return Classification(
        status=status,
        limit_type=limit_type,
        provider=provider,
        limits=limits,
        remaining=dict(hdrs.remaining),
        resets_s=dict(hdrs.resets_s),
        retry_after_s=retry_after,
        too_large=too_large and limit_type in _RATE_CLASSES,
        error_type=etype,
        error_code=code,
        message=message,
    )


_OPENAI_STATED = re.compile(r"tokens per min\b[^:]*:\s*limit\s+(\d+)", re.IGNORECASE)
#: Relative difference between a 429's stated token limit and the header's beyond which the
#: 429 is taken to name another limit (both are whole tokens per minute of the same account).
_SAME_LIMIT = 0.02


def _other_token_limit(
    message: str, limits: dict[LimitType, float]
) -> tuple[LimitType, dict[LimitType, float]]:
    """An OpenAI-style token 429 whose message states a per-minute limit other than the one
    ``x-ratelimit-limit-tokens`` states was not refused by that limit: its headers describe one
    token limit, so the other is an output-token limit (as a gateway in front of the provider,
    or the simulated provider, may enforce). It is named ``OUTPUT_TOKENS`` with the stated
    value among the limits, so the output budget is the one cut and capped, not the combined
    one the headers show has room. Otherwise the 429 stays ``TOKENS``."""
    match = _OPENAI_STATED.search(message)
    header = limits.get(LimitType.TOKENS)
    if match is None or header is None or header <= 0:
        return LimitType.TOKENS, limits
    stated = float(match.group(1))
    if stated <= 0 or abs(stated - header) <= _SAME_LIMIT * header:
        return LimitType.TOKENS, limits
    return LimitType.OUTPUT_TOKENS, {**limits, LimitType.OUTPUT_TOKENS: stated}


def _decide(
    status: int, etype: str | None, code: str | None, message: str, hdrs: RateLimitHeaders
) -> LimitType:
    if 200 <= status < 300:
        return LimitType.NONE
    # Explicit spend / billing types: OpenAI insufficient_quota (429), Anthropic billing_error.
    if etype in _SPEND_TYPES or code in _SPEND_TYPES:
        return LimitType.SPEND
    # Explicit overload: Anthropic 529 overloaded_error, 503 from anyone.
    if status in (529, 503) or etype in _OVERLOAD_TYPES or code in _OVERLOAD_TYPES:
        return LimitType.OVERLOAD
    # An explicit rate-limit 429 (OpenAI's messages mention billing pages, so this comes
    # before the spend wording check).
    explicit_rate = etype in ("requests", "tokens", "rate_limit_error") or (
        code == "rate_limit_exceeded"
    )
    if status == 429 and explicit_rate:
        return _rate_type(etype, message, hdrs)
    # Spend wording on a 4xx: Anthropic "Your credit balance is too low" (400
    # invalid_request_error), spend/budget caps of gateways (403/400/429).
    if status in (400, 402, 403, 429) and message and _SPEND_WORDS.search(message):
        return LimitType.SPEND
    if status == 402:
        return LimitType.SPEND
    if status == 429:
        return _rate_type(etype, message, hdrs)
    if status >= 500 and message and _OVERLOAD_WORDS.search(message):
        return LimitType.OVERLOAD
    return LimitType.NONE


def _rate_type(etype: str | None, message: str, hdrs: RateLimitHeaders) -> LimitType:
    """A 429: OpenAI names the limit in error.type; Anthropic in the message; else headers.
    A limit per day (its message says so) is ``DAILY`` whatever class it counts."""
    if message and _PER_DAY.search(message):
        return LimitType.DAILY
    if etype == "requests":
        return LimitType.REQUESTS
    if etype == "tokens":  # OpenAI has one (combined) token limit
        return LimitType.TOKENS
    named = _type_from_message(message) if message else None
    if named is not None:
        return named
    return _from_remaining(hdrs)
