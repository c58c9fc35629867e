"""Building the gateway and its parts from the settings (``evalfleet gateway serve``, launch).

Key minter per alias: the provider's admin API (``EVALFLEET_PROVIDER_ADMIN_KEY``, at the alias's
base URL) or the alias's static-key Secret block. Provider keys for the gateway come from Prefect
Secret blocks (``PrefectSecretKeyStore``) so that launch (a flow) and gateway (a service) share
them without the ledger ever holding one.
"""

from __future__ import annotations

import os
import socket
import uuid
from typing import Any

from evalfleet.errors import ConfigError, ServiceUnavailable
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
from gateway.replicas import ReplicaRegistry, ValkeyRegistry
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


def replica_registry(settings: Settings) -> ReplicaRegistry | None:
    """Where this gateway meets the other replicas serving its aliases (None: it is alone)."""
    if settings.gateway_budget_sharing == "solo":
        return None
    assert settings.valkey_url is not None  # checked by Settings
    replica_id = (
        settings.gateway_replica_id
        or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    )
    return ValkeyRegistry(settings.valkey_url, replica_id, ttl_s=settings.gateway_replica_ttl_s)


def check_registry(settings: Settings) -> None:
    """Raise ``ServiceUnavailable`` when budgets are shared through a Valkey that does not
    answer (the gateway's start would fail the same way, inside the server)."""
    if settings.gateway_budget_sharing == "solo":
        return
    import redis

    assert settings.valkey_url is not None  # checked by Settings
    client = redis.Redis.from_url(
        settings.valkey_url, socket_timeout=2.0, socket_connect_timeout=2.0
    )
    try:
        client.ping()
    except (redis.RedisError, OSError) as exc:
        raise ServiceUnavailable(
            "EVALFLEET_VALKEY_URL",
            "the gateway shares its aliases' budgets with its other replicas through it and "
            f"cannot reach it ({type(exc).__name__}: {exc})",
        ) from None
    finally:
        client.close()


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
        replicas=replica_registry(settings),
        share_interval_s=settings.gateway_share_interval_s,
        share_429s=settings.gateway_share_429s,
        **extra,
    )
