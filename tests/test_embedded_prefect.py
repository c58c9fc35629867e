"""``evalfleet.embedded.prefect_server``: the one helper that starts a local Prefect server (for
the demo, both benches and the tests' session server). It answers its health endpoint before it
is yielded, leaves no process or temporary folder behind, and a server that does not come up is
a ``PrefectServerError`` carrying the end of its log."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx
import pytest

from evalfleet.embedded import PrefectServerError, prefect_database_url, prefect_server
from evalfleet.errors import ConfigError


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.slow
def test_a_sqlite_server_answers_then_leaves_nothing_behind() -> None:
    with prefect_server(start_timeout_s=120.0) as server:
        assert server.api_url.startswith("http://127.0.0.1:")
        assert httpx.get(f"{server.api_url}/health", timeout=5).status_code == 200
        home = server.log_path.parent
        assert (home / "prefect.db").exists()  # Prefect's default SQLite file under its home
    assert _group_gone(server.pid)
    assert not home.exists()


@pytest.mark.slow
def test_a_server_that_exits_raises_with_its_log_tail(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = int(taken.getsockname()[1])
        with (
            pytest.raises(PrefectServerError, match="did not start: it exited") as caught,
            prefect_server(home=tmp_path / "home", port=port, start_timeout_s=120.0),
        ):
            pytest.fail("a server on a port in use must not come up")
    assert f"Port {port} is already in use" in caught.value.log_tail
    assert caught.value.log_tail in str(caught.value)
    assert (tmp_path / "home").is_dir()  # a given home is kept (the demo's data/prefect)


def test_a_server_that_does_not_answer_in_time_is_stopped(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    with (
        pytest.raises(PrefectServerError, match=r"did not answer .*/api/health within 0 s"),
        prefect_server(home=tmp_path, log_path=log, start_timeout_s=0.0),
    ):
        pytest.fail("unreachable")
    assert log.exists()


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("postgresql://u:p@h:5432/db", "postgresql+asyncpg://u:p@h:5432/db"),
        ("postgresql+psycopg://u@h/db", "postgresql+asyncpg://u@h/db"),
        ("postgresql+asyncpg://u@h/db", "postgresql+asyncpg://u@h/db"),
        ("sqlite:////tmp/prefect.db", "sqlite+aiosqlite:////tmp/prefect.db"),
    ],
)
def test_the_database_url_gets_the_servers_async_driver(given: str, expected: str) -> None:
    assert prefect_database_url(given) == expected


@pytest.mark.parametrize("given", ["not a url", "mysql://u@h/db"])
def test_a_bad_database_url_names_the_option(given: str) -> None:
    with pytest.raises(ConfigError, match=r"^--prefect-db: "):
        prefect_database_url(given, option="--prefect-db")
