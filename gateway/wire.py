"""What the gateway reads and writes on the wire, per flavour (``openai``, ``anthropic``):
the gateway key a harness presents, the request sent upstream in its place (the alias's model,
the run's provider key), errors in each flavour's own shape (which the SDKs turn into their
exception types), the provider headers a harness's SDK reads, and a call's token usage from a
response body or a streamed event.

Kept apart from the gateway's call path (``gateway.app``): these are the two APIs' formats,
stateless functions of a request, a body or headers, with no pacing, spend or ledger in them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import SecretStr
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.responses import JSONResponse

__all__ = [
    "DEFAULT_ANTHROPIC_VERSION",
    "PASS_HEADERS",
    "PASS_PREFIXES",
    "CallUsage",
    "bad_request",
    "error_response",
    "passthrough_headers",
    "presented_key",
    "unauthorized",
    "upstream_request",
    "usage_from_body",
]

PASS_HEADERS = ("retry-after", "retry-after-ms", "x-should-retry", "request-id", "x-request-id")
PASS_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")
DEFAULT_ANTHROPIC_VERSION = "2023-06-01"


def upstream_request(
    flavour: str,
    body: dict[str, Any],
    harness_headers: Headers,
    model: str,
    provider_key: SecretStr,
) -> tuple[bytes, dict[str, str]]:
    """The body and headers sent to the provider for a harness's request: the alias's model,
    the run's provider key in the flavour's header, Anthropic's version and beta headers as the
    harness sent them, and for an OpenAI stream ``include_usage`` (the gateway records every
    call's tokens, so it asks for them whatever the harness asked)."""
    upstream_body = {**body, "model": model}
    if body.get("stream") and flavour == "openai":
        upstream_body["stream_options"] = {
            **(body.get("stream_options") or {}),
            "include_usage": True,
        }
    headers = {"content-type": "application/json"}
    if flavour == "openai":
        headers["authorization"] = f"Bearer {provider_key.get_secret_value()}"
    else:
        headers["x-api-key"] = provider_key.get_secret_value()
        headers["anthropic-version"] = harness_headers.get(
            "anthropic-version", DEFAULT_ANTHROPIC_VERSION
        )
        if "anthropic-beta" in harness_headers:
            headers["anthropic-beta"] = harness_headers["anthropic-beta"]
    return json.dumps(upstream_body).encode(), headers


def error_response(
    flavour: str,
    status: int,
    etype: str,
    message: str,
    *,
    code: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    """An error in the flavour's own shape (the SDKs turn it into their exception types)."""
    body: dict[str, Any]
    if flavour == "anthropic":
        body = {"type": "error", "error": {"type": etype, "message": message}}
    else:
        body = {"error": {"message": message, "type": etype, "param": None, "code": code}}
    return JSONResponse(body, status_code=status, headers=headers)


def passthrough_headers(headers: httpx.Headers) -> dict[str, str]:
    """The provider headers a harness's SDK reads: rate limits, retry-after, request id."""
    out = {}
    for name, value in headers.items():
        lower = name.lower()
        if lower in PASS_HEADERS or lower.startswith(PASS_PREFIXES):
            out[lower] = value
    return out


@dataclass
class CallUsage:
    """Tokens of a finished call by class."""

    input_total: int = 0
    input_cached: int = 0
    output: int = 0

    @property
    def uncached(self) -> int:
        return max(0, self.input_total - self.input_cached)


def usage_from_body(flavour: str, body: Any, usage: CallUsage) -> None:
    """Fill ``usage`` from a response body or one streamed event (either flavour)."""
    if not isinstance(body, dict):
        return
    if flavour == "openai":
        u = body.get("usage")
        if isinstance(u, dict):
            usage.input_total = int(u.get("prompt_tokens") or 0)
            usage.output = int(u.get("completion_tokens") or 0)
            details = u.get("prompt_tokens_details")
            if isinstance(details, dict):
                usage.input_cached = int(details.get("cached_tokens") or 0)
        return
    u = body.get("usage")
    if body.get("type") == "message_start" and isinstance(body.get("message"), dict):
        u = body["message"].get("usage")
    if not isinstance(u, dict):
        return
    if "input_tokens" in u:
        cached = int(u.get("cache_read_input_tokens") or 0)
        created = int(u.get("cache_creation_input_tokens") or 0)
        usage.input_cached = cached
        usage.input_total = int(u.get("input_tokens") or 0) + cached + created
    if "output_tokens" in u:
        usage.output = int(u.get("output_tokens") or 0)


def presented_key(request: Request) -> str | None:
    """The gateway key the harness sent (``Authorization: Bearer`` or ``x-api-key``)."""
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer ") and auth[7:].strip():
        return auth[7:].strip()
    key = request.headers.get("x-api-key", "").strip()
    return key or None


def unauthorized(flavour: str, message: str) -> JSONResponse:
    """A 401 the SDK does not retry: no gateway key, or one unknown, revoked or expired."""
    return error_response(
        flavour,
        401,
        "authentication_error" if flavour == "anthropic" else "invalid_request_error",
        message,
        code="invalid_api_key",
        headers={"x-should-retry": "false"},
    )


def bad_request(flavour: str, message: str) -> JSONResponse:
    """A 400 the SDK does not retry."""
    return error_response(
        flavour,
        400,
        "invalid_request_error",
        message,
        headers={"x-should-retry": "false"},
    )
