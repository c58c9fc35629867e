"""Tasks around a run's two keys: mint both at launch, fetch the gateway key for an instance,
revoke both at close, abort or failed launch.

Where the raw gateway key lives between launch and the instances: a Prefect Secret block per run
(``evalfleet-run-<id>-gateway-key``), the same mechanism ``gateway.keys`` uses for the provider
key. Instances may run in other processes or on ECS, and a flow parameter must never carry a
secret, so the instance loads it from Prefect by run id. Revoking deletes the block.
"""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime
from typing import Any

from pydantic import SecretStr
from sqlalchemy import select

from evalfleet.errors import KeyManagementError
from evalfleet.settings import get_settings
from gateway.aliases import load_aliases
from gateway.keys import (
    KeyMinter,
    PrefectSecretKeyMinter,
    PrefectSecretKeyStore,
    ProviderAdminKeyMinter,
    mint_run_keys,
    revoke_run_keys,
)
from ledger.models import Run
from tasks.ledger_io import engine, sessions


def gateway_key_block(run_id: str) -> str:
    """The Prefect Secret block holding a run's raw gateway key."""
    return f"evalfleet-run-{run_id.lower()}-gateway-key"


def key_minter(alias_name: str) -> KeyMinter:
    """The alias's minter: the provider's admin API, or its static key's Secret block."""
    settings = get_settings()
    alias = load_aliases(settings.aliases_file, provider_sim_url=settings.provider_sim_url).get(
        alias_name
    )
    if alias.key_minter == "prefect_secret":
        return PrefectSecretKeyMinter(alias.static_key_block or "")
    if settings.provider_admin_key is None:
        raise KeyManagementError(
            f"alias {alias_name} mints keys through the provider's admin API: "
            "set EVALFLEET_PROVIDER_ADMIN_KEY"
        )
    return ProviderAdminKeyMinter(settings.provider_sim_url, settings.provider_admin_key)


def _run_alias(run_id: str) -> str:
    with engine().connect() as conn:
        return str(conn.execute(select(Run.alias).where(Run.id == run_id)).scalar_one())


def mint_keys(run_id: str, alias: str, spend_cap_micro_usd: int) -> None:
    """Mint the run's provider and gateway keys; keep the raw gateway key in its Secret block."""
    from prefect.blocks.system import Secret

    keys = mint_run_keys(
        sessions(),
        run_id=run_id,
        spend_cap_micro_usd=spend_cap_micro_usd,
        minter=key_minter(alias),
        store=PrefectSecretKeyStore(),
        now=datetime.now(UTC),
        ttl_s=get_settings().key_ttl_s,
    )
    block: Any = Secret(value=keys.gateway_key)
    block.save(gateway_key_block(run_id), overwrite=True, _sync=True)


def load_gateway_key(run_id: str) -> SecretStr:
    """The run's raw gateway key, or KeyManagementError if the run has none (revoked)."""
    from prefect.blocks.system import Secret

    try:
        block: Any = Secret.load(gateway_key_block(run_id), _sync=True)  # type: ignore[call-arg]
    except ValueError:
        raise KeyManagementError(
            f"run {run_id} has no gateway key (revoked or never minted)"
        ) from None
    return SecretStr(str(block.get()))


def revoke_keys(run_id: str) -> list[str]:
    """Revoke both keys of the run (idempotent); returns the key ids revoked now."""
    from prefect.blocks.system import Secret

    revoked = revoke_run_keys(
        sessions(),
        run_id,
        minter=key_minter(_run_alias(run_id)),
        store=PrefectSecretKeyStore(),
        now=datetime.now(UTC),
    )
    with contextlib.suppress(ValueError):  # already gone: revocation is idempotent
        Secret.delete(gateway_key_block(run_id), _sync=True)  # type: ignore[call-arg]
    return revoked
