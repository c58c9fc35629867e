"""The embedded stack: the simulated provider and the gateway served on loopback in this process.

Used by ``evalfleet demo`` and the end-to-end tests. The gateway reads run keys from Prefect
Secret blocks (``PrefectSecretKeyStore``, where the launch flow puts them), records every call
in the ledger and paces locally with the aliases' seed budgets (``InProcessPacer``).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

from pydantic import SecretStr

from gateway.aliases import Aliases, load_aliases
from gateway.app import Gateway
from gateway.keys import PrefectSecretKeyStore
from gateway.pacer_local import InProcessPacer
from gateway.provider_sim.profile import SimProfile
from gateway.provider_sim.server import ProviderSim
from gateway.serving import ServerThread
from tasks.ledger_io import engine


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
