"""``evalfleet provider-sim serve --port P [--profile FILE]``: run the simulated provider."""

from __future__ import annotations

from pathlib import Path

import click

from evalfleet.errors import ConfigError
from evalfleet.settings import get_settings


@click.group(name="provider-sim")
def provider_sim() -> None:
    """The simulated LLM provider (OpenAI + Anthropic APIs, real rate-limit protocol)."""


@provider_sim.command(name="serve")
@click.option("--port", type=click.IntRange(1, 65535), default=8301, show_default=True)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option(
    "--profile",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="YAML/JSON profile (limits, prices, latency, output, overload); default: embedded.",
)
def serve(port: int, host: str, profile: Path | None) -> None:
    """Serve the simulated provider until interrupted. Needs EVALFLEET_PROVIDER_ADMIN_KEY."""
    from gateway.provider_sim.profile import load_profile
    from gateway.provider_sim.server import ProviderSim
    from gateway.serving import serve as run

    settings = get_settings()
    if settings.provider_admin_key is None:
        raise ConfigError(
            "EVALFLEET_PROVIDER_ADMIN_KEY", ["required: the admin key of /admin/keys"]
        )
    sim = ProviderSim(load_profile(profile), settings.provider_admin_key)
    click.echo(
        f"provider-sim on http://{host}:{port} (OpenAI /v1/chat/completions, Anthropic /v1/messages)"
    )
    run(sim.app, host, port)


def register(root: click.Group) -> None:
    root.add_command(provider_sim)
