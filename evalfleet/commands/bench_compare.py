"""``evalfleet bench compare``: a changed planner's rows judged against a full run's baselines.

``--old FILE`` (repeatable): ``bench planner --json`` output with every policy, on the code
before the change. ``--new FILE`` (repeatable): the same scenarios' ``bench planner --policy
planner --json`` on the changed code. Prints how many scenarios meet every target before and
after, the geometric mean of the makespans (new over old), the planner's 429s, and each
scenario whose verdict flips, with what it now misses (``sim.compare``). ``--json`` prints one
object instead. The baselines are run once and any number of planner changes are judged
against them, as each tuning round of docs/bench-planner.md did by hand.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from sim.compare import Comparison, Flip, compare, read_results


def _seconds(value: float | None) -> str:
    return "stalled" if value is None else f"{value:,.1f} s"


def _flip_line(flip: Flip) -> str:
    moved = f"{_seconds(flip.old_makespan_s)} -> {_seconds(flip.new_makespan_s)}"
    if not flip.missed:
        return f"  {flip.scenario}: {moved}"
    return f"  {flip.scenario}: {moved}; {'; '.join(flip.missed)}"


def format_comparison(result: Comparison) -> str:
    """The comparison as the lines ``bench compare`` prints."""
    mean = "-" if result.mean_makespan_ratio is None else f"{result.mean_makespan_ratio:.4f}"
    lines = [
        f"scenarios compared: {result.compared}",
        f"meet every target: {result.met_before} -> {result.met_after}",
        f"makespan, new / old (geometric mean): {mean}",
        f"planner 429s: {result.http_429_before:,} -> {result.http_429_after:,}"
        f" (highest rate_429 now {result.highest_rate_429_after:g})",
        f"newly met ({len(result.newly_met)}):",
        *(_flip_line(f) for f in result.newly_met),
        f"newly missed ({len(result.newly_missed)}):",
        *(_flip_line(f) for f in result.newly_missed),
    ]
    if result.not_compared:
        shown = ", ".join(result.not_compared[:10])
        more = len(result.not_compared) - 10
        lines.append(
            f"not compared ({len(result.not_compared)}: not in --old, or no planner row): "
            + shown
            + (f", and {more} more" if more > 0 else "")
        )
    if result.old_only:
        lines.append(f"in --old only, not run again: {result.old_only}")
    return "\n".join(lines)


@click.command(name="compare")
@click.option(
    "--old",
    "old_files",
    multiple=True,
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="`bench planner --json` output with every policy (the baselines); repeatable.",
)
@click.option(
    "--new",
    "new_files",
    multiple=True,
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="`bench planner --policy planner --json` output of the changed planner; repeatable.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_compare(old_files: tuple[Path, ...], new_files: tuple[Path, ...], as_json: bool) -> None:
    """Judge a changed planner's rows against a full run's baselines."""
    result = compare(read_results(old_files), read_results(new_files))
    if as_json:
        click.echo(json.dumps(result.as_json()))
    else:
        click.echo(format_comparison(result))


def register(root: click.Group) -> None:
    group = root.commands["bench"]
    assert isinstance(group, click.Group)
    group.add_command(bench_compare)
