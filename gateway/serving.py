"""Serving ASGI apps with uvicorn: in the foreground (CLI) or in a background thread.

``ServerThread`` runs an app on 127.0.0.1 in a thread with its own event loop, waits (bounded)
until it accepts connections and stops it on exit: used by tests and ``evalfleet bench
gateway`` so that the real SDKs talk real HTTP to the gateway and the simulated provider.
"""

from __future__ import annotations

import socket
import threading
import time
from types import TracebackType
from typing import Any

import uvicorn

from evalfleet.errors import EvalfleetError


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _config(app: Any, host: str, port: int) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        lifespan="on",
        timeout_keep_alive=30,
        timeout_graceful_shutdown=2,
        backlog=4096,
    )


def serve(app: Any, host: str, port: int) -> None:
    """Serve ``app`` until interrupted (SIGINT/SIGTERM)."""
    uvicorn.Server(_config(app, host, port)).run()


class ServerThread:
    """``with ServerThread(app) as url:`` — the app served on loopback for the block."""

    def __init__(self, app: Any, port: int | None = None, start_timeout_s: float = 10.0) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._server = uvicorn.Server(_config(app, "127.0.0.1", self.port))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._timeout = start_timeout_s

    def __enter__(self) -> str:
        self._thread.start()
        deadline = time.monotonic() + self._timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise EvalfleetError(f"server on port {self.port} did not start")
            time.sleep(0.02)
        return self.url

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=15)
