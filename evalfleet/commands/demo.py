"""`evalfleet demo` (what `make demo` runs): one whole run on the embedded default, then a report.

Starts what the embedded default needs and stops it at the end: a local Prefect server
(``PREFECT_HOME`` under ``data/prefect``, SQLite), the simulated provider with limits small
enough to bind, the gateway, and the in-process launcher. Launches a run of ``--instances``
``simulated`` instances through the ``launch-run`` flow, runs the dispatcher, planner and
supervisor loop flows until the run closes, shows live progress (done, live, ceiling, binding
constraint, 429s), and ends with a summary table and a timeline PNG under ``data/demo/<time>/``.
The Prefect UI (URL printed at start) shows the flow runs and artifacts while it runs.
"""

from __future__ import annotations

import copy
import faulthandler
import json
import secrets
import signal
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from evalfleet.errors import EvalfleetError

# Small limits so that the pacer and the provider bind within a couple of minutes.
PROVIDER_RPM = 480.0  # 8 calls/s: below the pacer's seed; the provider's headers cap the budget
PACER_CALLS_PER_S = 10.0
PACER_TOKENS_PER_S = 20_000.0
#: The demo's instances (the shipped ``simulated`` curve is fitted for these options:
#: ``evalfleet curves fit-simulated``): ~5.5 calls each, ~0.44 calls/s while running.
HARNESS_OPTIONS: dict[str, Any] = {
    "calls_median": 5,
    "calls_sigma": 0.4,
    "think_s": 2.0,
    "token_scale": 0.15,
}
#: Live instances at most (static cap = in-process threads): room for the planner's ceiling to
#: bind below it. Measured here an instance draws ~0.27 calls/s over its whole life (boot and
#: landing included), so 8 calls/s needs ~30 live; at 24 the static cap bound instead.
FLEET_CAP = 40
#: A slot's time per task outside the harness with the in-process launcher, as measured here:
#: claim to first call ~6 s on average (up to ~20 s for the first wave), landing ~3 s.
PLANNER_BOOT_S = 8.0


class DemoError(EvalfleetError):
    """The demo could not start one of its services."""


def demo_aliases() -> dict[str, Any]:
    """The embedded aliases with the demo's small pacer seed on ``sim-openai``."""
    from gateway.aliases import DEFAULT_ALIASES

    data = copy.deepcopy(DEFAULT_ALIASES)
    for alias in data["aliases"]:
        if alias["name"] == "sim-openai":
            alias["pacer"].update(
                calls_per_s=PACER_CALLS_PER_S, tokens_per_s=PACER_TOKENS_PER_S, cooldown_s=10.0
            )
    return data


def demo_profile() -> Any:
    from gateway.provider_sim.profile import DEFAULT_PROFILE, profile_from

    data = copy.deepcopy(DEFAULT_PROFILE)
    data["openai"]["rpm"] = PROVIDER_RPM
    data.update(latency_s=0.3, latency_per_output_token_s=0.002, output_fraction_min=0.3)
    return profile_from(data, source="demo provider profile")


def progress_line(run_id: str, total: int) -> str:
    from evalfleet.commands.run import run_summary

    s = run_summary(run_id)
    done = sum(n for k, n in s["instances"].items() if k in _TERMINAL)
    live = sum(n for k, n in s["instances"].items() if k in ("booting", "running", "evaluating"))
    width = 30
    filled = int(width * done / max(total, 1))
    return (
        f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} done | live {live} | "
        f"ceiling {s['ceiling'] if s['ceiling'] is not None else '-'} "
        f"({s['binding'] or 'no decision yet'}) | 429s {s['rate_limited']}"
    )


_TERMINAL = ("resolved", "unresolved", "error", "aborted", "lost")


@click.command("demo")
@click.option("--instances", default=100, show_default=True, type=click.IntRange(1, 2000))
@click.option(
    "--prefect-db",
    default=None,
    metavar="URL",
    help="PostgreSQL database for the demo's Prefect server (postgresql+asyncpg://...); it is "
    "created if missing. Default: SQLite, which can stall under the instances' concurrent writes.",
)
def demo(instances: int, prefect_db: str | None) -> None:
    """Run ~100 simulated instances end to end on the embedded default; report and plot."""
    from evalfleet.embedded import prefect_server
    from evalfleet.settings import export_environment, export_settings, get_settings
    from gateway.serving import free_port

    # SIGTERM runs the cleanup (servers stopped) like Ctrl-C; SIGUSR1 dumps every thread's stack
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    base = get_settings().data_dir
    out = base / "demo" / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    with prefect_server(
        prefect_db,
        create_database=prefect_db is not None,
        option="--prefect-db",
        home=base / "prefect",
        log_path=out / "prefect-server.log",
        ui=True,
    ) as server:
        api_url = server.api_url
        click.echo(f"Prefect server: {api_url.removesuffix('/api')}  (UI: flow runs, artifacts)")
        export_environment(
            {
                "PREFECT_API_URL": api_url,
                "PREFECT_SERVER_EPHEMERAL_ENABLED": "false",
                "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
                "PREFECT_LOGGING_LEVEL": "WARNING",
            }
        )
        import prefect.context

        prefect.context.refresh_global_settings_context()
        aliases_file = out / "aliases.json"
        aliases_file.write_text(json.dumps(demo_aliases(), indent=2))
        sim_port, gw_port = free_port(), free_port()
        admin_key = secrets.token_urlsafe(24)
        export_settings(
            database_url=f"sqlite:///{out / 'ledger.sqlite3'}",
            provider_admin_key=admin_key,
            provider_sim_url=f"http://127.0.0.1:{sim_port}",
            gateway_url=f"http://127.0.0.1:{gw_port}",
            aliases_file=str(aliases_file),
            planner_tick_s="5",
            planner_boot_s=str(PLANNER_BOOT_S),
            supervisor_tick_s="5",
            heartbeat_s="5",
            visibility_timeout_s="60",
            static_cap=str(FLEET_CAP),
            in_process_threads=str(FLEET_CAP),
            dispatch_tick_s="0.5",
        )
        _run_demo(out, instances, admin_key, sim_port, gw_port)
    click.echo(f"done in {time.monotonic() - t0:.0f} s; everything the demo started is stopped")


def _run_demo(out: Path, instances: int, admin_key: str, sim_port: int, gw_port: int) -> None:
    from pydantic import SecretStr

    from evalfleet.embedded import start_stack
    from flows.dispatch import dispatcher_loop
    from flows.launch import launch_run
    from flows.planner_loop import planner_loop
    from flows.supervisor import supervisor_loop

    config = {
        "name": "demo",
        "harness": {"name": "simulated", "options": HARNESS_OPTIONS},
        "evaluator": {"name": "simulated", "options": {"duration_s": 0.2, "resolve_rate": 0.74}},
        "alias": "sim-openai",
        "instances": [f"demo__instance-{i:04d}" for i in range(instances)],
        "caps": {"spend_usd": 50.0},
    }
    with start_stack(demo_profile(), SecretStr(admin_key), sim_port=sim_port, gateway_port=gw_port):
        run_id = launch_run(config=config, idempotency_key=f"demo-{out.name}")
        click.echo(f"run {run_id}: {instances} simulated instances on alias sim-openai")
        loops = [
            threading.Thread(target=planner_loop, kwargs={"until_idle": True}, daemon=True),
            threading.Thread(
                target=supervisor_loop,
                kwargs={"until_idle": True, "scale_eval_pool": False},
                daemon=True,
            ),
        ]
        for thread in loops:
            thread.start()
        stop = threading.Event()
        printer = threading.Thread(target=_print_progress, args=(run_id, instances, stop))
        printer.start()
        try:
            dispatcher_loop(launcher="in-process", until_idle=True)
            for thread in loops:
                thread.join(timeout=120)
        finally:
            stop.set()
            printer.join()
        click.echo("")
        _report(run_id, out)


def _print_progress(run_id: str, total: int, stop: threading.Event) -> None:
    tty = sys.stdout.isatty()
    while not stop.wait(2.0):
        line = progress_line(run_id, total)
        click.echo(("\r" + line) if tty else line, nl=not tty)
    click.echo(("\r" if tty else "") + progress_line(run_id, total))


def _report(run_id: str, out: Path) -> None:
    from evalfleet.commands.demo_report import summary_table, timeline_png

    click.echo(summary_table(run_id))
    png = timeline_png(
        run_id, out / "timeline.png", PACER_CALLS_PER_S, PROVIDER_RPM / 60.0, PACER_TOKENS_PER_S
    )
    click.echo(f"timeline: {png}")


def register(root: click.Group) -> None:
    root.add_command(demo)
