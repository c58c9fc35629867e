"""The ``evalfleet`` command line: one click group; each area registers its own subcommands.

User mistakes (``EvalfleetError``, ``SettingsError``) print a clear message and exit 2.
"""

from __future__ import annotations

import importlib
import sys

import click

from evalfleet.errors import ConfigError, EvalfleetError
from evalfleet.settings import SettingsError

# Modules that expose ``register(group)`` to add their commands; imported lazily so that a
# broken optional area cannot stop `evalfleet --help`.
COMMAND_MODULES = (
    "evalfleet.commands.bench",  # first: the others add subcommands to its group
    "evalfleet.commands.db",
    "evalfleet.commands.config",
    "evalfleet.commands.bench_queue",
    "evalfleet.commands.bench_planner",
    "evalfleet.commands.bench_compare",
    "evalfleet.commands.bench_tally",
    "evalfleet.commands.bench_trace",
    "evalfleet.commands.bench_gateway",
    "evalfleet.commands.bench_replicas",
    "evalfleet.commands.bench_dispatch",
    "evalfleet.commands.curves",
    "evalfleet.commands.provider_sim",
    "evalfleet.commands.gateway",
    "evalfleet.commands.keys",
    "evalfleet.commands.run",
    "evalfleet.commands.demo",
    "evalfleet.commands.control",
    "evalfleet.commands.s3",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """evalfleet: rate-limit-aware LLM-agent evaluation runs on Prefect."""


def _register_all() -> None:
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(cli)


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    _register_all()
    try:
        cli.main(args=argv, prog_name="evalfleet", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return 2
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 1
    except ConfigError as exc:
        # One problem per line, each with the path of the field, so every defect is visible.
        count = len(exc.problems)
        click.echo(f"error: {exc.source}: {count} problem{'s' if count != 1 else ''}", err=True)
        for problem in exc.problems:
            click.echo(f"  {problem}", err=True)
        return exc.exit_code
    except (EvalfleetError, SettingsError) as exc:
        click.echo(f"error: {exc}", err=True)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
