"""``evalfleet bench tally``: a batch of ``bench planner --json`` results summed up.

``FILE`` (one or more): ``bench planner --json`` output with every policy. Prints how many
scenarios meet every target, by the header style of their provider (``none``: no rate-limit
headers), by the limit that binds the planner's row and by both, and by header style with
the operator's cache belief (right or wrong) and with the binding class's seed over its limit
(``sim.tally.seed_bucket``); the highest rate_429, the
instances past their timeout, and each miss with what it misses (``sim.tally``). ``--json``
prints one object instead. A scenario found in several files counts once (the later file's).
Bad files are a ``ConfigError`` naming the file and line, as for ``bench compare``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import click

from evalfleet.commands.bench_planner import SCENARIO_DIR
from sim.compare import read_results
from sim.tally import Group, Tally, tally, traits_by_name


def _share(group: Group) -> str:
    return f"{group.met} of {group.total}"


def _groups(title: str, groups: Mapping[str, Group]) -> list[str]:
    width = max((len(k) for k in groups), default=0)
    return [title, *(f"  {k:<{width}}  {_share(g)}" for k, g in groups.items())]


def format_tally(result: Tally) -> str:
    """The summary as the lines ``bench tally`` prints."""
    lines = [f"meet every target: {result.met} of {result.judged} scenarios"]
    lines += _groups("by the provider's rate-limit headers:", result.by_headers)
    lines += _groups("by the limit that binds the planner's run:", result.by_binding_limit)
    lines += _groups("by both:", result.by_headers_and_binding)
    lines += _groups("by the operator's cache belief:", result.by_headers_and_belief)
    lines += _groups(
        "by the binding class's seed over its limit at the start:", result.by_headers_and_seed
    )
    highest = (
        f"{result.highest_rate_429:g} ({result.highest_rate_429_scenario})"
        if result.highest_rate_429_scenario is not None
        else "0 (no 429s)"
    )
    lines.append(f"highest rate_429: {highest}")
    lines.append(
        f"instances past their timeout: {result.timeouts:,} in {result.runs_with_timeouts} runs"
    )
    lines.append(f"misses ({len(result.misses)}):")
    lines += [
        f"  {m.scenario} [{m.headers}, {m.binding_limit}]: {'; '.join(m.missed)}"
        for m in result.misses
    ]
    if result.without_baselines:
        lines.append(
            f"judged on ratio and rate_429 alone ({len(result.without_baselines)}: no baseline "
            "rows; run `bench planner` with every policy to judge them against the baselines): "
            + ", ".join(result.without_baselines)
        )
    if result.not_judged:
        lines.append(
            f"not judged ({len(result.not_judged)}: no planner row): "
            + ", ".join(result.not_judged)
        )
    return "\n".join(lines)


@click.command(name="tally")
@click.argument(
    "files",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def bench_tally(files: tuple[Path, ...], as_json: bool) -> None:
    """Sum up `bench planner --json` results: targets met, by headers, binding limit, cache
    belief and seed."""
    result = tally(read_results(files), traits_by_name(SCENARIO_DIR))
    if as_json:
        click.echo(json.dumps(result.as_json()))
    else:
        click.echo(format_tally(result))


def register(root: click.Group) -> None:
    group = root.commands["bench"]
    assert isinstance(group, click.Group)
    group.add_command(bench_tally)
