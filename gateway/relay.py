"""Relaying a provider's streamed (server-sent events) response to the harness.

Owns the two things a stream needs beyond a plain response: the call's usage read from the
events as they pass (OpenAI's last event carries it, Anthropic's ``message_start`` and
``message_delta`` events), and an end hook that runs once however the response ends: sent in
full, failed upstream, or cancelled by the harness hanging up, even before the first chunk.
The gateway's call path (``gateway.app``) settles the call's pacer permit and spend
reservation in that hook; nothing here knows of them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from starlette.responses import StreamingResponse

from gateway.wire import CallUsage, usage_from_body
from ledger.models import CLIENT_CLOSED

__all__ = ["RelayedStream", "relay_events"]


class RelayedStream(StreamingResponse):
    """A relayed stream that calls ``on_end`` however the response ends: sent in full, failed,
    or cancelled by the harness hanging up (even before the body's first chunk)."""

    def __init__(self, content: AsyncIterator[bytes], *, on_end: Callable[[], None], **kw: Any):
        super().__init__(content, **kw)
        self._on_end = on_end

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_end()


async def relay_events(
    upstream: httpx.Response,
    flavour: str,
    usage: CallUsage,
    finish: Callable[[int], None],
) -> AsyncIterator[bytes]:
    """Yield the provider's raw chunks unchanged, reading each ``data:`` event's usage into
    ``usage``; then ``finish(status)``: 200 when the provider's stream was relayed to its end,
    502 when it failed (the error propagates), ``CLIENT_CLOSED`` when the harness went away.
    ``finish`` is synchronous and runs first in the ``finally``, where a cancelled relay's next
    ``await`` may raise again; the upstream response is closed after it."""
    buffer = b""
    status = CLIENT_CLOSED  # until the provider's stream has been relayed to its end
    try:
        async for chunk in upstream.aiter_raw():
            yield chunk
            buffer += chunk
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.startswith(b"data:") and not line.startswith(b"data: [DONE]"):
                    try:
                        usage_from_body(flavour, json.loads(line[5:]), usage)
                    except ValueError:
                        continue
        status = 200
    except httpx.HTTPError:
        status = 502
        raise
    finally:
        finish(status)
        await upstream.aclose()
