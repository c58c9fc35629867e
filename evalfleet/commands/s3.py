"""``evalfleet s3 ...``: the S3 launch path from the command line.

* ``s3 trigger --bucket B --prefix P``: create or update the Prefect automation that launches a
  run for each ``s3.object.created`` event under ``s3://B/P`` (idempotent).
* ``s3 watch --bucket B --prefix P [--once] [--interval S]``: the poller that turns new config
  objects into those events (for OSS Prefect servers and local S3; on AWS, EventBridge does it).
  A rejected object is reported and recorded, and the watch goes on; a bucket that cannot be
  listed is an error with ``--once`` and a retry after ``--interval`` otherwise.
* ``s3 drops [--bucket B]``: what the watcher has handled (emitted or rejected, with why).

Settings: ``EVALFLEET_S3_ENDPOINT_URL`` for MinIO/moto/LocalStack; AWS credentials from boto3's
chain; ``PREFECT_API_URL`` for the Prefect server.
"""

from __future__ import annotations

import time

import click

from deployments import s3 as s3_launch
from evalfleet.config_sources import s3_client
from evalfleet.errors import ConfigSourceUnavailable
from evalfleet.settings import get_settings

_location = [
    click.option("--bucket", required=True, help="Bucket the run configs are dropped into."),
    click.option(
        "--prefix", default="", show_default=True, help="Key prefix watched (e.g. runs/)."
    ),
]


def _with_location(func: click.decorators.FC) -> click.decorators.FC:
    for option in reversed(_location):
        func = option(func)
    return func


@click.group(name="s3")
def s3_group() -> None:
    """Launch runs by dropping run configs into S3."""


@s3_group.command(name="trigger")
@_with_location
@click.option(
    "--deployment",
    default=s3_launch.LAUNCH_DEPLOYMENT,
    show_default=True,
    help="The launch deployment (flow/deployment) the automation runs.",
)
def trigger_command(bucket: str, prefix: str, deployment: str) -> None:
    """Create or update the automation launching a run per config dropped under the prefix."""
    import asyncio

    from prefect import get_client

    async def apply() -> str:
        async with get_client() as client:
            return await s3_launch.apply_s3_trigger(client, bucket, prefix, deployment)

    action = asyncio.run(apply())
    click.echo(f"automation {s3_launch.automation_name(bucket, prefix)!r}: {action}")


@s3_group.command(name="watch")
@_with_location
@click.option("--once", is_flag=True, help="Poll once and exit (exit 2 if S3 is unreadable).")
@click.option(
    "--interval",
    type=click.FloatRange(0.5, 3600.0),
    default=10.0,
    show_default=True,
    help="Seconds between polls.",
)
def watch_command(bucket: str, prefix: str, once: bool, interval: float) -> None:
    """Emit an s3.object.created event for each new valid config under s3://BUCKET/PREFIX."""
    from tasks.ledger_io import engine

    watcher = s3_launch.S3Watcher(
        s3=s3_client(get_settings().s3_endpoint_url),
        engine=engine(),
        bucket=bucket,
        prefix=prefix,
        emit=s3_launch.prefect_emitter(),
    )
    while True:
        try:
            report = watcher.poll_once()
        except ConfigSourceUnavailable as exc:
            if once or not exc.retryable:
                raise
            click.echo(f"warning: {exc}; retrying in {interval:g}s", err=True)
        else:
            _print_report(report)
        if once:
            return
        time.sleep(interval)


def _print_report(report: s3_launch.WatchReport) -> None:
    for info in report.emitted:
        click.echo(f"launch  {info.uri}")
    for info, reason in report.rejected:
        click.echo(f"reject  {info.uri}: {reason}")
    for info, reason in report.deferred:
        click.echo(f"later   {info.uri}: {reason}")
    click.echo(
        f"{len(report.emitted)} launched, {len(report.rejected)} rejected, "
        f"{len(report.deferred)} deferred, {report.known} already seen"
    )


@s3_group.command(name="drops")
@click.option("--bucket", default=None, help="Only this bucket.")
@click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True)
def drops_command(bucket: str | None, limit: int) -> None:
    """List the config objects the watcher has handled, newest first."""
    from tasks.ledger_io import engine

    for drop in s3_launch.recorded_drops(engine(), bucket, limit):
        detail = f": {drop.reason}" if drop.reason else ""
        click.echo(f"{drop.seen_at:%Y-%m-%d %H:%M:%S} {drop.state:8} {drop.identity}{detail}")


def register(root: click.Group) -> None:
    root.add_command(s3_group)
