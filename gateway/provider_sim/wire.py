"""What the simulated provider puts on the wire, as Starlette responses.

Rate-limit headers, 429 bodies, spend and overload errors are rendered by ``sim.protocol`` (one
source of truth with the simulator: the real OpenAI ``x-ratelimit-*`` / Anthropic
``anthropic-ratelimit-*`` headers and error shapes); this module only wraps them for HTTP and
adds the two errors the simulator never needs: authentication and malformed requests (the key
is never echoed).
"""

from __future__ import annotations

from starlette.responses import JSONResponse, Response

from sim import protocol
from sim.limits import LimitsSnapshot, ProviderAdmission

rate_limit_headers = protocol.rate_limit_headers


def _http(rendered: protocol.RenderedResponse, extra: dict[str, str] | None = None) -> Response:
    return Response(
        rendered.body,
        status_code=rendered.status,
        headers={**(extra or {}), **rendered.headers},
        media_type="application/json",
    )


def rate_limited(
    style: str, admission: ProviderAdmission, snap: LimitsSnapshot, now_epoch: float
) -> Response:
    """The 429 for a rejected admission, naming the limit that was hit (``style`` "none": no
    headers, and a 429 that names nothing)."""
    return _http(protocol.render_rejection(style, admission, snap, now_epoch, model="sim"))


def spend_error(flavour: str, snap: LimitsSnapshot, now_epoch: float) -> Response:
    """The key's spend cap is used up (OpenAI 429 insufficient_quota, Anthropic 400 credit)."""
    return _http(
        protocol.render_spend(flavour), protocol.rate_limit_headers(flavour, snap, now_epoch)
    )


def overloaded(flavour: str, retry_after_s: float = 1.0) -> Response:
    """Overloaded: Anthropic 529 ``overloaded_error``; OpenAI 503."""
    return _http(protocol.render_overload(flavour, retry_after_s))


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
    error = {"type": "authentication_error", "message": "invalid x-api-key"}
    return JSONResponse({"type": "error", "error": error}, status_code=401)


def invalid_request(flavour: str, message: str) -> JSONResponse:
    if flavour == "openai":
        error = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
        return JSONResponse({"error": error}, status_code=400)
    error = {"type": "invalid_request_error", "message": message}
    return JSONResponse({"type": "error", "error": error}, status_code=400)
