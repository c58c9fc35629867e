"""`evalfleet launch | status | pause | resume | close | deploy`: a run's life from the CLI.

``launch`` runs the launch-run flow here (``--via-deployment`` asks the Prefect deployment
instead); ``status`` prints counts by state, tokens, cost and the latest planner decision from
the ledger; ``pause``/``resume`` set the ledger flag (with an audit reason) and mirror pool
pauses to the Prefect work pool; ``close`` revokes both keys of a run and closes it; ``deploy``
creates pools, queues, limits and deployments from prefect.yaml, idempotently.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import click
from sqlalchemy import func, select

from evalfleet.errors import NotFound


def run_summary(run_id: str) -> dict[str, Any]:
    """Counts by state, tokens, cost, 429s and the latest decision of one run (from the ledger)."""
    from ledger.models import InstanceResult, LlmCall, PlannerDecision, Run
    from tasks.ledger_io import engine

    with engine().connect() as conn:
        run = conn.execute(
            select(Run.id, Run.name, Run.alias, Run.state, Run.failure_reason).where(
                Run.id == run_id
            )
        ).one_or_none()
        if run is None:
            raise NotFound(f"run {run_id} does not exist")
        states = {
            s: int(n)
            for s, n in conn.execute(
                select(InstanceResult.state, func.count())
                .where(InstanceResult.run_id == run_id)
                .group_by(InstanceResult.state)
            ).all()
        }
        totals = conn.execute(
            select(
                func.coalesce(func.sum(InstanceResult.calls), 0),
                func.coalesce(func.sum(InstanceResult.input_tokens), 0),
                func.coalesce(func.sum(InstanceResult.output_tokens), 0),
            ).where(InstanceResult.run_id == run_id)
        ).one()
        # cost from the gateway's call records (an instance row may land before the last batch)
        cost = conn.execute(
            select(func.coalesce(func.sum(LlmCall.cost_micro_usd), 0)).where(
                LlmCall.run_id == run_id
            )
        ).scalar_one()
        rate_limited = conn.execute(
            select(func.count()).where(LlmCall.run_id == run_id, LlmCall.status == 429)
        ).scalar_one()
        decision = conn.execute(
            select(PlannerDecision.ceiling, PlannerDecision.binding, PlannerDecision.live)
            .where(PlannerDecision.alias == run.alias)
            .order_by(PlannerDecision.id.desc())
            .limit(1)
        ).one_or_none()
    return {
        "run": run.id,
        "name": run.name,
        "alias": run.alias,
        "state": run.state,
        "failure_reason": run.failure_reason,
        "instances": states,
        "calls": int(totals[0]),
        "input_tokens": int(totals[1]),
        "output_tokens": int(totals[2]),
        "cost_usd": int(cost) / 1e6,
        "rate_limited": int(rate_limited),
        "ceiling": decision.ceiling if decision else None,
        "binding": decision.binding if decision else None,
    }


def _recent_runs(limit: int = 20) -> list[str]:
    from ledger.models import Run
    from tasks.ledger_io import engine

    with engine().connect() as conn:
        return list(
            conn.execute(select(Run.id).order_by(Run.created_at.desc()).limit(limit)).scalars()
        )


@click.command("launch")
@click.argument("config", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--idempotency-key", default=None, help="Default: the config's content hash.")
def launch(config: Path, idempotency_key: str | None) -> None:
    """Launch the run described by CONFIG (YAML/JSON): prints its id."""
    from flows.launch import launch_run

    run_id = launch_run(config_uri=str(config), idempotency_key=idempotency_key)
    click.echo(run_id)


@click.command("status")
@click.argument("run_id", required=False)
def status(run_id: str | None) -> None:
    """Print a run's progress from the ledger (all recent runs without RUN_ID): counts by
    state, calls, tokens, cost, 429s, the planner's ceiling and binding constraint — the same
    fields the Valkey progress hash and the Prefect progress artifact carry."""
    from tasks.progress import from_ledger

    ids = [run_id] if run_id else _recent_runs()
    if not ids:
        click.echo("no runs")
    for rid in ids:
        p = from_ledger(rid)
        updated = p.updated_at.isoformat(timespec="seconds") if p.updated_at else "-"
        click.echo(f"{p.run_id} {p.name} {p.summary()} | updated {updated}")
        if p.failure_reason:
            click.echo(f"  failed: {p.failure_reason}")


def _pause(scope: str, target: str, paused: bool, reason: str, actor: str) -> None:
    from evalfleet.settings import get_settings
    from ledger.pauses import set_pause
    from tasks.ledger_io import engine

    set_pause(engine(), scope, target, paused, actor=actor, reason=reason)
    if scope == "pool" and target == "harness":
        from prefect import get_client
        from prefect.client.schemas.actions import WorkPoolUpdate

        with get_client(sync_client=True) as client:
            client.update_work_pool(get_settings().harness_pool, WorkPoolUpdate(is_paused=paused))


def _pause_command(paused: bool) -> click.Command:
    verb = "pause" if paused else "resume"

    @click.command(verb)
    @click.argument("scope", type=click.Choice(["pool", "run"]))
    @click.argument("target")
    @click.option("--reason", required=True, help="Audit reason (required).")
    @click.option("--actor", default="cli", show_default=True)
    def command(scope: str, target: str, reason: str, actor: str) -> None:
        _pause(scope, target, paused, reason, actor)
        click.echo(f"{verb}d {scope} {target}")

    command.help = f"{verb.capitalize()} a pool (harness, eval, gateway) or a run."
    return command


@click.command("close")
@click.argument("run_id")
def close(run_id: str) -> None:
    """Revoke both keys of RUN_ID and close it once its instances are terminal."""
    from tasks.keys import revoke_keys
    from tasks.supervise import complete_runs

    revoked = revoke_keys(run_id)
    closed = complete_runs()
    click.echo(f"revoked {len(revoked)} key(s); {'closed' if run_id in closed else 'not closed'}")


@click.command("deploy")
@click.option(
    "--ecs-vars",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    default=None,
    help="JSON/YAML of the ECS pool's variables (see deployments/README.md).",
)
def deploy(ecs_vars: Path | None) -> None:
    """Create work pools, queues, limits and deployments on PREFECT_API_URL (idempotent)."""
    from prefect import get_client

    from deployments.apply import apply_project, load_ecs_variables, load_project
    from evalfleet.settings import get_settings

    spec = load_project()
    ecs = load_ecs_variables(ecs_vars) if ecs_vars else None

    async def go() -> Any:
        async with get_client() as client:
            return await apply_project(client, spec, get_settings(), ecs)

    report = asyncio.run(go())
    for kind, name, action in report.lines:
        click.echo(f"{action:9} {kind:11} {name}")


def register(root: click.Group) -> None:
    for command in (launch, status, _pause_command(True), _pause_command(False), close, deploy):
        root.add_command(command)
