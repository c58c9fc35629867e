"""Per-run keys: the provider key (minted with the run's spend cap) and the gateway key.

A run gets two secrets at launch:

* a **provider key**, minted through a ``KeyMinter`` — the provider's admin API (here the
  simulated provider's ``/admin/keys``, which enforces the key's spend cap), or a static key
  held in a Prefect Secret block for providers without an admin API (revoking it at the
  provider is impossible; the gateway key and the gateway's spend cap are then the guard);
* a **gateway key**, minted here, that the run's harnesses send to the gateway.

Where the raw provider key lives (the decision): in a ``ProviderKeyStore`` — a Prefect Secret
block per run (``evalfleet-run-<run id>-provider-key``) when launch and gateway are different
processes, or the gateway process's memory when the gateway mints the keys itself (tests,
benchmarks). The gateway caches it in memory. It is never in the ledger, a log, a flow parameter,
an artifact or an exception message: the ledger stores ``sha256`` hashes only, raw secrets are
``SecretStr`` (masked in ``repr``/``str``) and are returned to the caller exactly once.

``revoke_run_keys(run_id)`` revokes both: the gateway key (in the ledger; the gateway checks it
on every call) and the provider key (at the provider, and deleted from the store).
"""

from __future__ import annotations

import hashlib
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol

import httpx
from pydantic import SecretStr
from sqlalchemy import select, update
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from evalfleet.errors import KeyManagementError
from ledger.models import ApiKey

GATEWAY_KEY_PREFIX = "efg_"
KIND_PROVIDER = "provider"
KIND_GATEWAY = "gateway"
STATE_ACTIVE = "active"
STATE_REVOKED = "revoked"


def hash_secret(secret: str) -> str:
    """The stored form of a key: ``sha256:<hex>`` (keys are random, 256-bit: no salt needed)."""
    return "sha256:" + hashlib.sha256(secret.encode("utf-8")).hexdigest()


def new_gateway_secret() -> SecretStr:
    """A fresh gateway key (``efg_`` + 43 url-safe characters, 256 bits)."""
    return SecretStr(GATEWAY_KEY_PREFIX + secrets.token_urlsafe(32))


@dataclass(frozen=True)
class MintedKey:
    """A provider key just minted: the raw secret (masked in repr) and the provider's id for it."""

    secret: SecretStr
    external_id: str | None


class KeyMinter(Protocol):
    """Mints and revokes provider keys."""

    def mint(self, *, run_id: str, spend_cap_micro_usd: int, expires_at: datetime) -> MintedKey:
        """A new provider key for the run, capped at ``spend_cap_micro_usd``."""

    def revoke(self, external_id: str | None) -> None:
        """Revoke a key minted by ``mint`` (idempotent: an unknown/revoked key is fine)."""


def _provider_error(what: str, response: httpx.Response) -> KeyManagementError:
    detail = ""
    try:
        body = response.json()
        error = body.get("error") if isinstance(body, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            detail = ": " + error["message"][:200]
    except ValueError:
        pass
    return KeyManagementError(f"{what} failed with HTTP {response.status_code}{detail}")


class ProviderAdminKeyMinter:
    """Mints keys through the provider's admin API (``POST /admin/keys``, ``DELETE /admin/keys/id``).

    The simulated provider implements this API and enforces each key's spend cap.
    """

    def __init__(
        self,
        base_url: str,
        admin_key: SecretStr,
        *,
        timeout_s: float = 5.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._base_url = base_url.rstrip("/")
        self._admin_key = admin_key
        self._timeout = timeout_s
        self._transport = transport

    def _client(self) -> httpx.Client:
        return httpx.Client(
            base_url=self._base_url,
            timeout=self._timeout,
            transport=self._transport,
            headers={"authorization": f"Bearer {self._admin_key.get_secret_value()}"},
        )

    def mint(self, *, run_id: str, spend_cap_micro_usd: int, expires_at: datetime) -> MintedKey:
        payload = {
            "name": f"evalfleet-run-{run_id}",
            "spend_cap_micro_usd": spend_cap_micro_usd,
            "expires_at": expires_at.isoformat(),
        }
        try:
            with self._client() as client:
                response = client.post("/admin/keys", json=payload)
        except httpx.HTTPError as exc:
            raise KeyManagementError(f"minting a provider key: {type(exc).__name__}") from None
        if response.status_code != 201:
            raise _provider_error("minting a provider key", response)
        body = response.json()
        return MintedKey(secret=SecretStr(str(body["key"])), external_id=str(body["id"]))

    def revoke(self, external_id: str | None) -> None:
        if external_id is None:
            return
        try:
            with self._client() as client:
                response = client.delete(f"/admin/keys/{external_id}")
        except httpx.HTTPError as exc:
            raise KeyManagementError(
                f"revoking provider key {external_id}: {type(exc).__name__}"
            ) from None
        if response.status_code not in (200, 204, 404):
            raise _provider_error(f"revoking provider key {external_id}", response)


class PrefectSecretKeyMinter:
    """For a provider without an admin API: every run uses the static key in a Secret block.

    ``revoke`` cannot revoke a static key at the provider; it does nothing (the run's gateway
    key is revoked, and the gateway enforces the run's spend cap).
    """

    def __init__(self, block_name: str) -> None:
        self._block_name = block_name

    def mint(self, *, run_id: str, spend_cap_micro_usd: int, expires_at: datetime) -> MintedKey:
        from prefect.blocks.system import Secret

        try:
            block: Any = Secret.load(self._block_name, _sync=True)  # type: ignore[call-arg]
        except ValueError:
            raise KeyManagementError(
                f"Prefect Secret block {self._block_name!r} not found"
            ) from None
        return MintedKey(secret=SecretStr(str(block.get())), external_id=None)

    def revoke(self, external_id: str | None) -> None:
        return None


class ProviderKeyStore(Protocol):
    """Where the gateway finds a run's raw provider key."""

    def put(self, run_id: str, secret: SecretStr) -> None: ...

    def delete(self, run_id: str) -> None: ...

    async def aget(self, run_id: str) -> SecretStr | None: ...


class MemoryKeyStore:
    """Provider keys in this process's memory (a gateway that minted the keys itself)."""

    def __init__(self) -> None:
        self._keys: dict[str, SecretStr] = {}

    def put(self, run_id: str, secret: SecretStr) -> None:
        self._keys[run_id] = secret

    def delete(self, run_id: str) -> None:
        self._keys.pop(run_id, None)

    async def aget(self, run_id: str) -> SecretStr | None:
        return self._keys.get(run_id)


def secret_block_name(run_id: str) -> str:
    """The Prefect Secret block holding a run's provider key."""
    return f"evalfleet-run-{run_id.lower()}-provider-key"


class PrefectSecretKeyStore:
    """Provider keys in Prefect Secret blocks, one per run (shared by launch and gateway)."""

    def put(self, run_id: str, secret: SecretStr) -> None:
        from prefect.blocks.system import Secret

        Secret(value=secret).save(secret_block_name(run_id), overwrite=True, _sync=True)  # type: ignore[call-arg]

    def delete(self, run_id: str) -> None:
        from prefect.blocks.system import Secret

        try:
            Secret.delete(secret_block_name(run_id), _sync=True)  # type: ignore[call-arg]
        except ValueError:
            return  # already gone

    async def aget(self, run_id: str) -> SecretStr | None:
        from prefect.blocks.system import Secret

        try:
            block: Any = await Secret.aload(secret_block_name(run_id))
        except ValueError:
            return None
        return SecretStr(str(block.get()))


@dataclass(frozen=True)
class RunKeys:
    """The result of minting a run's keys. ``gateway_key`` is shown once; store it nowhere."""

    run_id: str
    gateway_key: SecretStr
    gateway_key_id: str
    provider_key_id: str
    expires_at: datetime


def mint_run_keys(
    sessions: sessionmaker[Session],
    *,
    run_id: str,
    spend_cap_micro_usd: int,
    minter: KeyMinter,
    store: ProviderKeyStore,
    now: datetime,
    ttl_s: float,
) -> RunKeys:
    """Mint the run's provider key (capped) and gateway key; store hashes; all or nothing."""
    if spend_cap_micro_usd <= 0:
        raise KeyManagementError(
            f"run {run_id}: spend cap must be positive, got {spend_cap_micro_usd}"
        )
    expires_at = now + timedelta(seconds=ttl_s)
    provider = minter.mint(
        run_id=run_id, spend_cap_micro_usd=spend_cap_micro_usd, expires_at=expires_at
    )
    gateway_secret = new_gateway_secret()
    provider_row_id, gateway_row_id = str(uuid.uuid4()), str(uuid.uuid4())
    try:
        store.put(run_id, provider.secret)
        with sessions.begin() as session:
            for row_id, kind, secret, external_id in (
                (provider_row_id, KIND_PROVIDER, provider.secret, provider.external_id),
                (gateway_row_id, KIND_GATEWAY, gateway_secret, None),
            ):
                session.add(
                    ApiKey(
                        id=row_id,
                        run_id=run_id,
                        kind=kind,
                        key_hash=hash_secret(secret.get_secret_value()),
                        external_id=external_id,
                        spend_cap_micro_usd=spend_cap_micro_usd,
                        spent_micro_usd=0,
                        reserved_micro_usd=0,
                        state=STATE_ACTIVE,
                        expires_at=expires_at,
                        created_at=now,
                    )
                )
    except (SQLAlchemyError, httpx.HTTPError, ValueError, RuntimeError, OSError) as exc:
        store.delete(run_id)
        minter.revoke(provider.external_id)
        raise KeyManagementError(
            f"run {run_id}: storing the run's keys failed ({type(exc).__name__})"
        ) from None
    return RunKeys(
        run_id=run_id,
        gateway_key=gateway_secret,
        gateway_key_id=gateway_row_id,
        provider_key_id=provider_row_id,
        expires_at=expires_at,
    )


def revoke_run_keys(
    sessions: sessionmaker[Session],
    run_id: str,
    *,
    minter: KeyMinter,
    store: ProviderKeyStore,
    now: datetime,
) -> list[str]:
    """Revoke both keys of a run; returns the ids of the keys revoked now (idempotent).

    The gateway key goes first (the gateway refuses it from its next call on); then each
    provider key is revoked at the provider and dropped from the store. A provider failure
    raises and leaves that provider key ``active`` so that key recovery retries it.
    """
    revoked: list[str] = []
    with sessions.begin() as session:
        result = session.execute(
            update(ApiKey)
            .where(
                ApiKey.run_id == run_id,
                ApiKey.kind == KIND_GATEWAY,
                ApiKey.state == STATE_ACTIVE,
            )
            .values(state=STATE_REVOKED, revoked_at=now)
            .returning(ApiKey.id)
        )
        revoked.extend(str(r) for r in result.scalars())
    with sessions() as session:
        providers = session.execute(
            select(ApiKey.id, ApiKey.external_id).where(
                ApiKey.run_id == run_id,
                ApiKey.kind == KIND_PROVIDER,
                ApiKey.state == STATE_ACTIVE,
            )
        ).all()
    store.delete(run_id)
    for key_id, external_id in providers:
        minter.revoke(external_id)
        with sessions.begin() as session:
            session.execute(
                update(ApiKey)
                .where(ApiKey.id == key_id, ApiKey.state == STATE_ACTIVE)
                .values(state=STATE_REVOKED, revoked_at=now)
            )
        revoked.append(str(key_id))
    return revoked
