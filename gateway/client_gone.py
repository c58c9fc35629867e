"""A harness that hangs up while its call waits at the pacer: the call is dropped, not sent.

A harness stops waiting for a call when its instance deadline passes (``harnesses.base.Deadline``)
or its process dies; the gateway's pacer may be holding that call for minutes under a token
budget. Nothing would tell the pacer: the call would be admitted later, sent upstream and
billed, with no one to read the answer, and its budget taken from calls someone waits for.
``while_connected`` races a wait against the client's disconnect (Starlette's
``Request.is_disconnected``, polled): when the client has gone the wait is cancelled (the
pacer drops a cancelled waiter) and ``ClientGone`` is raised. A wait that finished at that
moment is handed back in ``ClientGone.result`` so its caller can give it back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from starlette.requests import Request

__all__ = ["DISCONNECT_POLL_S", "ClientGone", "while_connected"]

T = TypeVar("T")

#: How often a waiting call checks that its client is still there (seconds): a dropped call
#: is noticed within this, at the cost of one non-blocking receive per waiting call.
DISCONNECT_POLL_S = 0.5


class ClientGone(Exception):
    """The client hung up while the call waited. ``result``: what the wait returned if it
    finished as the client left (to be given back), else None."""

    def __init__(self, result: Any = None) -> None:
        super().__init__("the client closed the connection while the call waited")
        self.result = result


async def while_connected(
    request: Request, work: Awaitable[T], poll_s: float = DISCONNECT_POLL_S
) -> T:
    """``work``'s result, or ``ClientGone`` once the client has hung up (``work`` cancelled)."""
    task = asyncio.ensure_future(work)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                finished = None if task.cancelled() or task.exception() else task.result()
                raise ClientGone(finished)
    finally:
        if not task.done():  # our own cancellation: never leave the wait behind
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
