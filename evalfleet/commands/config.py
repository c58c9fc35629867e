"""``evalfleet config validate FILE``: check a run config and print its one-line summary.

Exit 0 and the summary (or, with ``--json``, the resolved config and its content hash) for a
good file; for a bad one ``ConfigError`` reaches ``evalfleet.cli.main``, which prints every
problem on its own line with the path of the field and exits 2.
"""

from __future__ import annotations

import json

import click

from evalfleet.runconfig import RunConfig


@click.group(name="config")
def config_group() -> None:
    """Run configs: validate before launching."""


@config_group.command(name="validate")
@click.argument("file", type=click.Path(dir_okay=True, path_type=str))
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print the resolved config (instances expanded) and its content hash as JSON.",
)
def validate_command(file: str, as_json: bool) -> None:
    """Validate the run config FILE (YAML or JSON); exit 2 listing every problem if invalid."""
    config = RunConfig.from_file(file)
    if as_json:
        payload = {
            "file": file,
            "summary": config.summary(),
            "content_hash": config.content_hash,
            "config": config.to_json_dict(),
        }
        click.echo(json.dumps(payload, indent=2, ensure_ascii=False))
    else:
        click.echo(f"ok: {config.summary()}")


def register(root: click.Group) -> None:
    root.add_command(config_group)
