"""``evalfleet bench replicas``: gateway replicas alone and sharing an alias's budget."""

from __future__ import annotations

import json

import click


@click.command(name="replicas")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option(
    "--pg-admin-url",
    default="postgresql://postgres@127.0.0.1:5432/postgres",
    show_default=True,
    help="PostgreSQL used to create the throwaway ledger database.",
)
@click.option(
    "--valkey-url",
    default="redis://127.0.0.1:6379/14",
    show_default=True,
    help="Valkey/Redis the replicas share budgets through (the bench's alias keys only).",
)
@click.option(
    "--budget",
    type=click.FloatRange(1.0, 2000.0),
    default=100.0,
    show_default=True,
    help="The alias's calls/s budget.",
)
@click.option(
    "--workers",
    type=click.IntRange(0, 500),
    multiple=True,
    help="Clients calling one replica back to back, once per replica (default: 24 and 8).",
)
@click.option(
    "--provider-rpm",
    type=click.FloatRange(1.0, 1e9),
    default=None,
    help="Limit the provider to this many calls a minute (below the budget: 429s are "
    "counted, and a third mode shares budgets without carrying 429s between replicas).",
)
@click.option("--warmup", type=click.FloatRange(0.5, 60.0), default=3.0, show_default=True)
@click.option("--duration", type=click.FloatRange(1.0, 600.0), default=10.0, show_default=True)
def bench_replicas(
    as_json: bool,
    pg_admin_url: str,
    valkey_url: str,
    budget: float,
    workers: tuple[int, ...],
    provider_rpm: float | None,
    warmup: float,
    duration: float,
) -> None:
    """Calls/s that gateway replicas send together, alone and sharing, against the budget."""
    from gateway.bench_replicas import ReplicaBenchOptions, run_replica_bench

    results = run_replica_bench(
        ReplicaBenchOptions(
            pg_admin_url=pg_admin_url,
            valkey_url=valkey_url,
            budget_calls_per_s=budget,
            workers=workers or (24, 8),
            warmup_s=warmup,
            duration_s=duration,
            provider_rpm=provider_rpm,
        )
    )
    if as_json:
        click.echo(json.dumps(results, indent=2))
        return
    limit = "" if provider_rpm is None else f"; the provider allows {provider_rpm / 60:g} calls/s"
    click.echo(f"budget {budget:g} calls/s{limit}; {duration:g} s counted after {warmup:g} s")
    for mode, figures in results["modes"].items():
        split = ", ".join(
            f"{r['calls_per_s']:g} ({r['throughput_share']:.0%} for {r['demand_share']:.0%} "
            "of the demand)"
            for r in figures["replicas"]
        )
        throttled = "/".join(str(r["http_429"]) for r in figures["replicas"])
        click.echo(
            f"{mode:>15}: {figures['calls_per_s']:g} calls/s together, "
            f"{figures['ratio_to_budget']:.2f}x the budget; 429s {figures['http_429']} "
            f"({throttled}); per replica {split}"
        )


def register(root: click.Group) -> None:
    bench = root.commands["bench"]
    assert isinstance(bench, click.Group)
    bench.add_command(bench_replicas)
