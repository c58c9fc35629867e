"""Building the gateway and its parts from the settings (``evalfleet gateway serve``, launch).

Key minter per alias: the provider's admin API (``EVALFLEET_PROVIDER_ADMIN_KEY``, at the alias's
base URL) or the alias's static-key Secret block. Provider keys for the gateway come from Prefect
Secret blocks (``PrefectSecretKeyStore``) so that launch (a flow) and gateway (a service) share
them without the ledger ever holding one.
"""

from __future__ import annotations

from typing import Any

from evalfleet.errors import ConfigError
from evalfleet.settings import Settings
from gateway.aliases import Alias, Aliases, load_aliases
from gateway.app import Gateway
from gateway.keys import (
    KeyMinter,
    PrefectSecretKeyMinter,
    PrefectSecretKeyStore,
    ProviderAdminKeyMinter,
    ProviderKeyStore,
)
from gateway.pacer_local import InProcessPacer
from gateway.pacer_prefect import PrefectPacer
from ledger.db import make_engine


def aliases_from(settings: Settings) -> Aliases:
    return load_aliases(settings.aliases_file, provider_sim_url=settings.provider_sim_url)


def minter_for(alias: Alias, settings: Settings) -> KeyMinter:
    """The key minter of an alias's provider."""
    if alias.key_minter == "prefect_secret":
        assert alias.static_key_block is not None  # validated by Alias
        return PrefectSecretKeyMinter(alias.static_key_block)
    if settings.provider_admin_key is None:
        raise ConfigError(
            "EVALFLEET_PROVIDER_ADMIN_KEY",
            [f"alias {alias.name} mints keys through the provider's admin API: set the admin key"],
        )
    return ProviderAdminKeyMinter(alias.base_url, settings.provider_admin_key)


def build_gateway(
    settings: Settings, *, store: ProviderKeyStore | None = None, **extra: Any
) -> Gateway:
    aliases = aliases_from(settings)
    pacer = (
        PrefectPacer(aliases, sync_interval_s=settings.pacer_sync_interval_s)
        if settings.gateway_pacer == "prefect"
        else InProcessPacer(aliases)
    )
    return Gateway(
        aliases=aliases,
        engine=make_engine(settings.ledger_url),
        store=store or PrefectSecretKeyStore(),
        pacer=pacer,
        max_retry_wait_s=settings.gateway_max_retry_wait_s,
        **extra,
    )
