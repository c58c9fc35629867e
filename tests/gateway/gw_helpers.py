"""Helpers shared by the gateway tests (imported by module path, never as ``conftest``, so
that one ``ADMIN_KEY`` exists however pytest imports the conftest)."""

from __future__ import annotations

import uuid
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from pydantic import SecretStr
from sqlalchemy import Engine

from gateway.aliases import Aliases, load_aliases
from gateway.app import Gateway
from gateway.keys import MemoryKeyStore, ProviderAdminKeyMinter, RunKeys, mint_run_keys
from gateway.pacer_local import InProcessPacer
from gateway.provider_sim.profile import DEFAULT_PROFILE, profile_from
from gateway.provider_sim.server import ProviderSim
from gateway.replicas import ValkeyRegistry
from gateway.serving import ServerThread
from ledger.db import session_factory
from ledger.models import Run

ADMIN_KEY = SecretStr("sim-admin-" + uuid.uuid4().hex)


def sim_profile(**overrides: Any) -> Any:
    data = {**DEFAULT_PROFILE, "output_fraction_min": 0.5, "output_fraction_max": 1.0}
    data.update(overrides)
    return profile_from(data)


def fast_aliases(sim_url: str, **pacer: float) -> Aliases:
    """The embedded aliases, with pacer budgets high enough not to interfere (unless given)."""
    base = load_aliases(None, provider_sim_url=sim_url)
    seed = {
        "calls_per_s": 10_000.0,
        "tokens_per_s": 1e9,
        "inflight_tokens": 1e10,
        "burst_s": 1.0,
        **pacer,
    }
    out = []
    for alias in base:
        values = {**alias.pacer.model_dump(), **seed}
        if alias.pacer.output_tokens_per_s is not None:
            values.setdefault("output_tokens_per_s", 1e9)
            values["output_tokens_per_s"] = pacer.get("output_tokens_per_s", 1e9)
        out.append(alias.model_copy(update={"pacer": type(alias.pacer)(**values)}))
    return Aliases(out)


@dataclass
class Stack:
    """A provider sim and a gateway served on loopback, sharing one ledger."""

    sim: ProviderSim
    sim_url: str
    gateway: Gateway
    url: str
    engine: Engine
    minter: ProviderAdminKeyMinter
    store: MemoryKeyStore

    def new_run(self, spend_cap_micro_usd: int = 10_000_000, alias: str = "sim-openai") -> RunKeys:
        run_id = str(uuid.uuid4())
        sessions = session_factory(self.engine)
        with sessions.begin() as session:
            session.add(
                Run(
                    id=run_id,
                    name="gw-test",
                    harness="sim",
                    alias=alias,
                    state="running",
                    spend_cap_micro_usd=spend_cap_micro_usd,
                    max_attempts=3,
                    config={},
                )
            )
        return mint_run_keys(
            sessions,
            run_id=run_id,
            spend_cap_micro_usd=spend_cap_micro_usd,
            minter=self.minter,
            store=self.store,
            now=datetime.now(UTC),
            ttl_s=3600,
        )


@dataclass
class Replicas:
    """Gateways serving one alias on loopback in front of one provider sim: their pacers, URLs
    and a gateway key valid on all of them."""

    gateways: list[Gateway]
    pacers: list[InProcessPacer]
    urls: list[str]
    secret: str


def start_replicas(
    stack: ExitStack,
    engine: Engine,
    *,
    names: tuple[str, ...],
    valkey_url: str | None,
    sim_rpm: float,
    **pacer: float,
) -> Replicas:
    """A provider sim allowing ``sim_rpm`` calls a minute (OpenAI flavour) and one gateway per
    name, sharing the alias's budgets (``pacer``) through Valkey when ``valkey_url`` is given,
    each pacing alone when it is None; served until ``stack`` closes."""
    sim = ProviderSim(sim_profile(openai={**DEFAULT_PROFILE["openai"], "rpm": sim_rpm}), ADMIN_KEY)
    sim_url = stack.enter_context(ServerThread(sim.app))
    aliases = fast_aliases(sim_url, **pacer)
    store = MemoryKeyStore()
    gateways, pacers, urls = [], [], []
    for name in names:
        local = InProcessPacer(aliases)
        gateway = Gateway(
            aliases=aliases,
            engine=engine,
            store=store,
            pacer=local,
            max_retry_wait_s=0.0,
            replicas=None if valkey_url is None else ValkeyRegistry(valkey_url, name, ttl_s=2.0),
            share_interval_s=0.2,
        )
        gateways.append(gateway)
        pacers.append(local)
        urls.append(stack.enter_context(ServerThread(gateway.app)))
    keys = Stack(
        sim=sim,
        sim_url=sim_url,
        gateway=gateways[0],
        url=urls[0],
        engine=engine,
        minter=ProviderAdminKeyMinter(sim_url, ADMIN_KEY),
        store=store,
    ).new_run()
    return Replicas(gateways, pacers, urls, keys.gateway_key.get_secret_value())
