"""Keys held in Prefect Secret blocks: the static-key minter and the per-run key store."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest
from prefect.blocks.system import Secret
from pydantic import SecretStr

from evalfleet.errors import KeyManagementError
from gateway.keys import PrefectSecretKeyMinter, PrefectSecretKeyStore, secret_block_name

pytestmark = pytest.mark.prefect


def test_static_key_minter_and_store_round_trip(prefect_api: str) -> None:
    block = f"evalfleet-test-static-{uuid.uuid4().hex[:8]}"
    Secret(value="sk-static-" + uuid.uuid4().hex).save(block, overwrite=True)
    minted = PrefectSecretKeyMinter(block).mint(
        run_id="r", spend_cap_micro_usd=1, expires_at=datetime.now(UTC)
    )
    assert minted.secret.get_secret_value().startswith("sk-static-")
    assert minted.external_id is None
    assert "sk-static" not in repr(minted)  # SecretStr masks it
    PrefectSecretKeyMinter(block).revoke(None)  # a static key cannot be revoked: a no-op
    with pytest.raises(KeyManagementError, match="not found"):
        PrefectSecretKeyMinter(f"{block}-missing").mint(
            run_id="r", spend_cap_micro_usd=1, expires_at=datetime.now(UTC)
        )

    run_id = str(uuid.uuid4())
    store = PrefectSecretKeyStore()
    store.put(run_id, SecretStr("sk-run-key"))
    stored = asyncio.run(store.aget(run_id))
    assert stored is not None
    assert stored.get_secret_value() == "sk-run-key"
    assert secret_block_name(run_id).startswith("evalfleet-run-")
    store.delete(run_id)
    store.delete(run_id)  # idempotent
    assert asyncio.run(store.aget(run_id)) is None
