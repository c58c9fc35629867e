"""``evalfleet bench gateway [--json]``: the gateway's added latency and calls/s per pacer."""

from __future__ import annotations

import json

import click

FLOORS = {
    "prefect_calls_per_s": 100.0,
    "prefect_overhead_ms_p99": 50.0,
    "inprocess_overhead_ms_p50": 5.0,
}


@click.command(name="gateway")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
@click.option(
    "--pg-admin-url",
    default="postgresql://postgres@127.0.0.1:5432/postgres",
    show_default=True,
    help="PostgreSQL used to create the throwaway ledger (and Prefect) databases.",
)
@click.option(
    "--prefect-api-url", default=None, help="Use this Prefect API instead of starting a server."
)
@click.option("--calls", type=click.IntRange(20, 100_000), default=300, show_default=True)
@click.option("--concurrency", type=click.IntRange(1, 1000), default=32, show_default=True)
@click.option("--duration", type=click.FloatRange(1.0, 600.0), default=5.0, show_default=True)
def bench_gateway(
    as_json: bool,
    pg_admin_url: str,
    prefect_api_url: str | None,
    calls: int,
    concurrency: int,
    duration: float,
) -> None:
    """Gateway added latency (p50/p99 vs the provider directly) and sustained calls/s."""
    from gateway.bench import BenchOptions, run_bench

    results = run_bench(
        BenchOptions(
            pg_admin_url=pg_admin_url,
            prefect_api_url=prefect_api_url,
            calls=calls,
            concurrency=concurrency,
            duration_s=duration,
        )
    )
    p, i = results["pacers"]["prefect"], results["pacers"]["inprocess"]
    results["floors_met"] = {
        "prefect_calls_per_s>=100": p["calls_per_s"] >= FLOORS["prefect_calls_per_s"],
        "prefect_overhead_ms_p99<=50": p["overhead_ms_p99"] <= FLOORS["prefect_overhead_ms_p99"],
        "inprocess_overhead_ms_p50<=5": i["overhead_ms_p50"] <= FLOORS["inprocess_overhead_ms_p50"],
    }
    if as_json:
        click.echo(json.dumps(results, indent=2))
        return
    for name, figures in results["pacers"].items():
        click.echo(
            f"{name:>9}: added p50 {figures['overhead_ms_p50']:.2f} ms, "
            f"p99 {figures['overhead_ms_p99']:.2f} ms, {figures['calls_per_s']:.0f} calls/s"
        )
    for floor, ok in results["floors_met"].items():
        click.echo(f"  floor {floor}: {'met' if ok else 'NOT met'}")


def register(root: click.Group) -> None:
    bench = root.commands["bench"]
    assert isinstance(bench, click.Group)
    bench.add_command(bench_gateway)
