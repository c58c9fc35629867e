"""The ``evalfleet bench`` group: benchmark commands that print figures (``--json`` for machines).

Each area adds its own subcommand to this group from its own module (see ``evalfleet.cli``).
"""

from __future__ import annotations

import click


@click.group(name="bench")
def bench() -> None:
    """Benchmarks: queue, planner, gateway, dispatch; compare judges a planner change, trace
    explains one scenario's run."""


def register(root: click.Group) -> None:
    root.add_command(bench)
