"""``evalfleet gateway serve --port P``: run the gateway (settings: EVALFLEET_GATEWAY_*)."""

from __future__ import annotations

import click

from evalfleet.settings import get_settings


@click.group(name="gateway")
def gateway_group() -> None:
    """The LLM gateway between harnesses and the provider."""


@gateway_group.command(name="serve")
@click.option(
    "--port", type=click.IntRange(1, 65535), default=None, help="Default: EVALFLEET_GATEWAY_PORT."
)
@click.option("--host", default=None, help="Default: EVALFLEET_GATEWAY_HOST.")
def serve(port: int | None, host: str | None) -> None:
    """Serve the gateway until interrupted (pacer: EVALFLEET_GATEWAY_PACER)."""
    from gateway.factory import build_gateway, check_registry
    from gateway.serving import serve as run

    settings = get_settings()
    check_registry(settings)  # a clear error now, not a traceback from the server's startup
    gateway = build_gateway(settings)
    host = host or settings.gateway_host
    port = port or settings.gateway_port
    click.echo(
        f"gateway on http://{host}:{port}; aliases: {', '.join(gateway.aliases.names())}; "
        f"pacer: {settings.gateway_pacer}; budgets: {settings.gateway_budget_sharing}"
    )
    run(gateway.app, host, port)


def register(root: click.Group) -> None:
    root.add_command(gateway_group)
