"""The embedded stack: a local Prefect server, and the simulated provider and the gateway served
on loopback in this process.

``prefect_server`` is the one place that starts a local ``prefect server start`` (used by
``evalfleet demo``, ``evalfleet bench dispatch``, ``evalfleet bench gateway`` and the test
session's Prefect fixture): a free loopback port, a given database (SQLite under its home by
default, or PostgreSQL, created first when asked), a bounded wait for its health endpoint, and
on exit its process group terminated, then killed after a bound. A server that does not come up
raises ``PrefectServerError`` with the tail of its log.

``start_stack`` serves the provider sim and the gateway (used by ``evalfleet demo`` and the
end-to-end tests). The gateway reads run keys from Prefect Secret blocks
(``PrefectSecretKeyStore``, where the launch flow puts them), records every call in the ledger
and paces locally with the aliases' seed budgets (``InProcessPacer``). Its imports are deferred
so that starting a Prefect server (e.g. from the tests' conftest) does not load the gateway.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

from evalfleet.errors import ConfigError, EvalfleetError

if TYPE_CHECKING:
    from pydantic import SecretStr

    from gateway.aliases import Aliases
    from gateway.app import Gateway
    from gateway.provider_sim.profile import SimProfile
    from gateway.provider_sim.server import ProviderSim

HEALTH_REQUEST_TIMEOUT_S = 2.0
LOG_TAIL_CHARS = 2000


class PrefectServerError(EvalfleetError):
    """A local Prefect server did not come up: its process exited, or its health endpoint did
    not answer within the start timeout. ``log_tail`` holds the end of the server's log."""

    def __init__(self, message: str, log_tail: str) -> None:
        self.log_tail = log_tail
        super().__init__(f"{message}; its log ends:\n{log_tail}" if log_tail else message)


@dataclass(frozen=True)
class PrefectServer:
    """A running local Prefect server: its API URL (``http://127.0.0.1:PORT/api``), the id of
    its process (also its process group: it runs in a session of its own) and its log file."""

    api_url: str
    pid: int
    log_path: Path


def prefect_database_url(url: str | URL, *, option: str = "Prefect database URL") -> str:
    """``url`` with the async driver Prefect's server needs (``postgresql+asyncpg``,
    ``sqlite+aiosqlite``); ``option`` names the setting in errors. Raises ``ConfigError``."""
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(option, ["not a database URL"]) from None
    backend = parsed.get_backend_name()
    if backend == "postgresql":
        parsed = parsed.set(drivername="postgresql+asyncpg")
    elif backend == "sqlite":
        parsed = parsed.set(drivername="sqlite+aiosqlite")
    else:
        raise ConfigError(option, ["must be a PostgreSQL or SQLite URL"])
    return parsed.render_as_string(hide_password=False)


def ensure_postgres_database(url: str | URL, *, option: str = "Prefect database URL") -> None:
    """Create the PostgreSQL database named by ``url`` if it does not exist yet (connecting to
    the server's ``postgres`` database). Raises ``ConfigError`` naming ``option`` for a URL that
    is not a PostgreSQL database URL or a server that cannot be reached."""
    import psycopg
    import psycopg.sql

    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(option, ["not a database URL"]) from None
    if not parsed.drivername.startswith("postgresql") or not parsed.database:
        raise ConfigError(option, ["must be a postgresql://.../DATABASE URL"])
    admin = parsed.set(drivername="postgresql", database="postgres")
    conninfo = admin.render_as_string(hide_password=False)
    try:
        with psycopg.connect(conninfo, autocommit=True, connect_timeout=5) as conn:
            exists = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", (parsed.database,)
            ).fetchone()
            if exists is None:
                conn.execute(
                    psycopg.sql.SQL("CREATE DATABASE {}").format(
                        psycopg.sql.Identifier(parsed.database)
                    )
                )
    except psycopg.Error as exc:
        raise ConfigError(option, [f"cannot reach PostgreSQL ({type(exc).__name__})"]) from None


def _server_environment(
    home: Path, database_url: str | None, ui: bool, inherit_environment: bool
) -> dict[str, str]:
    if inherit_environment:
        from evalfleet.settings import child_environment

        env = child_environment()
    else:  # only what the server needs: nothing of this process's settings leaks into it
        env = {"HOME": str(home), "PATH": str(Path(sys.executable).parent)}
    env["PREFECT_HOME"] = str(home)
    if database_url is not None:
        env["PREFECT_API_DATABASE_CONNECTION_URL"] = database_url
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    if not ui:
        env["PREFECT_UI_ENABLED"] = "false"
    env["PREFECT_SERVER_LOGGING_LEVEL"] = "WARNING"
    env.pop("PREFECT_API_URL", None)  # the server must not talk to another server
    return env


def _wait_until_healthy(
    proc: subprocess.Popen[bytes], url: str, log_path: Path, timeout_s: float, poll_s: float
) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=HEALTH_REQUEST_TIMEOUT_S).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        exited = proc.poll() is not None
        if exited or time.monotonic() > deadline:
            why = (
                f"exited with code {proc.returncode}"
                if exited
                else f"did not answer {url}/health within {timeout_s:g} s"
            )
            tail = log_path.read_text(errors="replace")[-LOG_TAIL_CHARS:]
            raise PrefectServerError(f"the Prefect server did not start: it {why}", tail)
        time.sleep(poll_s)


def _stop(proc: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM to the server's process group; SIGKILL if it is still there after ``timeout_s``."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:  # it ended between the poll and the signal
        proc.wait()


@contextmanager
def prefect_server(
    database_url: str | URL | None = None,
    *,
    create_database: bool = False,
    option: str = "Prefect database URL",
    home: Path | None = None,
    log_path: Path | None = None,
    port: int | None = None,
    ui: bool = False,
    inherit_environment: bool = True,
    start_timeout_s: float = 180.0,
    poll_s: float = 0.5,
    stop_timeout_s: float = 20.0,
) -> Iterator[PrefectServer]:
    """Start ``prefect server start`` on 127.0.0.1 and yield it once ``/api/health`` answers.

    ``database_url``: PostgreSQL (any driver; the server runs it with asyncpg) or a SQLite file
    URL; None = Prefect's SQLite file under ``home``. ``create_database`` creates a missing
    PostgreSQL database first; ``option`` names where the URL came from in a bad URL's
    ``ConfigError``. ``home`` is the server's ``PREFECT_HOME`` (kept); None = a temporary folder
    removed on exit. ``log_path`` (default ``home/server.log``) receives its output. ``port``:
    None = a free one. ``ui=False`` turns the UI off. ``inherit_environment=False`` gives the
    server only ``HOME``, ``PATH`` and its Prefect variables. It waits up to ``start_timeout_s``
    (polling every ``poll_s``), else raises ``PrefectServerError`` with the log's tail; on exit
    the server's process group gets SIGTERM, then SIGKILL after ``stop_timeout_s``.
    """
    if create_database:
        if database_url is None:
            raise ConfigError(option, ["a database to create needs a PostgreSQL URL"])
        ensure_postgres_database(database_url, option=option)
    server_db = (
        prefect_database_url(database_url, option=option) if database_url is not None else None
    )
    if port is None:
        from gateway.serving import free_port

        port = free_port()
    temporary = home is None
    home = Path(tempfile.mkdtemp(prefix="evalfleet-prefect-")) if home is None else home
    try:
        home.mkdir(parents=True, exist_ok=True)
        log_path = log_path or home / "server.log"
        env = _server_environment(home, server_db, ui, inherit_environment)
        command = [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1"]
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                [*command, "--port", str(port)],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        url = f"http://127.0.0.1:{port}/api"
        try:
            _wait_until_healthy(proc, url, log_path, start_timeout_s, poll_s)
            yield PrefectServer(api_url=url, pid=proc.pid, log_path=log_path)
        finally:
            _stop(proc, stop_timeout_s)
    finally:
        if temporary:
            shutil.rmtree(home, ignore_errors=True)


@dataclass
class EmbeddedStack:
    """Running provider sim + gateway; ``close()`` stops both."""

    sim: ProviderSim
    sim_url: str
    gateway: Gateway
    gateway_url: str
    aliases: Aliases
    _exits: ExitStack

    def close(self) -> None:
        self._exits.close()

    def __enter__(self) -> EmbeddedStack:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def start_stack(
    profile: SimProfile,
    admin_key: SecretStr,
    *,
    sim_port: int | None = None,
    gateway_port: int | None = None,
    aliases: Aliases | None = None,
    max_retry_wait_s: float = 30.0,
) -> EmbeddedStack:
    """Serve the provider sim and the gateway on loopback (ports: given or free)."""
    from gateway.aliases import load_aliases
    from gateway.app import Gateway
    from gateway.keys import PrefectSecretKeyStore
    from gateway.pacer_local import InProcessPacer
    from gateway.provider_sim.server import ProviderSim
    from gateway.serving import ServerThread
    from tasks.ledger_io import engine

    exits = ExitStack()
    try:
        sim = ProviderSim(profile, admin_key)
        sim_url = exits.enter_context(ServerThread(sim.app, port=sim_port))
        resolved = aliases or load_aliases(None, provider_sim_url=sim_url)
        gateway = Gateway(
            aliases=resolved,
            engine=engine(),
            store=PrefectSecretKeyStore(),
            pacer=InProcessPacer(resolved),
            max_retry_wait_s=max_retry_wait_s,
            pause_refresh_s=0.5,
        )
        gateway_url = exits.enter_context(ServerThread(gateway.app, port=gateway_port))
    except BaseException:
        exits.close()
        raise
    return EmbeddedStack(sim, sim_url, gateway, gateway_url, resolved, exits)
