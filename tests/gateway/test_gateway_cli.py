"""The commands as deployed: provider-sim and gateway as separate processes, the provider key
passed through a Prefect Secret block, and `evalfleet keys revoke`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine

from gateway.keys import PrefectSecretKeyStore, ProviderAdminKeyMinter, mint_run_keys
from gateway.serving import free_port
from ledger.db import session_factory
from ledger.models import Run
from tests.gateway.gw_helpers import ADMIN_KEY

pytestmark = pytest.mark.prefect
EVALFLEET = str(Path(sys.executable).parent / "evalfleet")


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [EVALFLEET, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _healthy(url: str, proc: subprocess.Popen[bytes], bound_s: float = 30) -> None:
    deadline = time.monotonic() + bound_s
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            assert proc.stdout is not None  # _start pipes it
            out = proc.stdout.read().decode() if proc.poll() is not None else ""
            pytest.fail(f"{url} did not start: {out[-2000:]}")
        time.sleep(0.2)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)


def test_serve_commands_and_keys_revoke(
    prefect_api: str, gw_ledger_url: str, gw_engine: Engine
) -> None:
    sim_port, gw_port = free_port(), free_port()
    env = {
        **os.environ,
        "PREFECT_API_URL": prefect_api,
        "EVALFLEET_PROVIDER_ADMIN_KEY": ADMIN_KEY.get_secret_value(),
        "EVALFLEET_PROVIDER_SIM_URL": f"http://127.0.0.1:{sim_port}",
        "EVALFLEET_DATABASE_URL": gw_ledger_url,
        "EVALFLEET_GATEWAY_PACER": "inprocess",
    }
    sim = _start(["provider-sim", "serve", "--port", str(sim_port)], env)
    gw = _start(["gateway", "serve", "--port", str(gw_port)], env)
    try:
        sim_url, gw_url = f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{gw_port}"
        _healthy(sim_url, sim)
        _healthy(gw_url, gw)
        run_id = str(uuid.uuid4())
        sessions = session_factory(gw_engine)
        with sessions.begin() as s:
            s.add(
                Run(
                    id=run_id,
                    name="cli",
                    harness="sim",
                    alias="sim-anthropic",
                    state="running",
                    spend_cap_micro_usd=10**7,
                    max_attempts=1,
                    config={},
                )
            )
        keys = mint_run_keys(
            sessions,
            run_id=run_id,
            spend_cap_micro_usd=10**7,
            minter=ProviderAdminKeyMinter(sim_url, ADMIN_KEY),
            store=PrefectSecretKeyStore(),
            now=datetime.now(UTC),
            ttl_s=600,
        )
        headers = {
            "x-api-key": keys.gateway_key.get_secret_value(),
            "anthropic-version": "2023-06-01",
        }
        body = {
            "model": "sim-anthropic",
            "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}],
        }
        r = httpx.post(gw_url + "/v1/messages", headers=headers, json=body, timeout=10)
        assert r.status_code == 200, r.text
        assert r.json()["type"] == "message"
        out = subprocess.run(
            [EVALFLEET, "keys", "revoke", run_id],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr
        assert "2 key(s) revoked" in out.stdout
        r = httpx.post(gw_url + "/v1/messages", headers=headers, json=body, timeout=10)
        assert r.status_code == 401
    finally:
        _stop(gw)
        _stop(sim)
