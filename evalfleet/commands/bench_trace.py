"""``evalfleet bench trace``: the planner's run on one simulated scenario, tick by tick.

Where ``bench planner`` says whether the planner met its targets, this says why (``sim.trace``):
per tick the fleet and the decision, the budgets beside the provider's true limits (hidden from
the planner) and the share of each the provider charged, and the window's 429s as the planner
was told them and as they truly were. Exactly one of ``--scenario FILE``, ``--random SEED`` or
``--wide SEED`` (one scenario of ``sim.generate`` / ``sim.generate_wide``: the seed a
``bench planner --random`` batch names it by). ``--every N`` prints every Nth tick, and every
tick with a 429 or a new binding constraint; ``--notes`` adds the controller's notes under
each printed tick; ``--json`` prints one object with the result row, the phases, the
instance the run ended on and every tick.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from evalfleet.errors import ConfigError

if TYPE_CHECKING:
    from sim.scenario import Scenario
    from sim.trace import EndsOn, Phase, PlannerTrace, TickTrace

_CLASSES = ("requests", "tokens", "input_tokens", "output_tokens")
_BUDGET_OF = {
    "requests": "calls_per_s",
    "tokens": "tokens_per_s",
    "input_tokens": "tokens_per_s",
    "output_tokens": "output_tokens_per_s",
}


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"


def _counts(counts: dict[str, int]) -> str:
    return ",".join(f"{name}:{n}" for name, n in sorted(counts.items())) or "-"


def _row(tick: TickTrace, classes: list[str]) -> list[str]:
    budgets = "/".join(_num(tick.budgets.get(_BUDGET_OF[c])) for c in classes)
    limits = "/".join(_num(tick.limits.get(c)) for c in classes)
    used = "/".join(f"{tick.used[c]:.2f}" if c in tick.used else "-" for c in classes)
    seen = f"{_counts(tick.seen)} -> {_counts(tick.hit)}" if tick.seen or tick.hit else ""
    return [
        f"{tick.t:.0f}",
        str(tick.live),
        str(tick.booting),
        str(tick.queued),
        str(tick.ceiling),
        tick.binding,
        "counted" if tick.cached_input_counts else "uncounted",
        budgets,
        limits,
        used,
        seen,
    ]


def _phase_text(trace: PlannerTrace, phase: Phase) -> str:
    span = f"{phase.name} {phase.start_s:.0f}-{phase.end_s:.0f} s: "
    if trace.binding_limit is None:
        return span + f"the lower bound is the {trace.bound_by.replace('_', ' ')}, not a limit"
    if phase.used is None or phase.lost_s is None:
        return span + "no ticks"
    return span + f"{trace.binding_limit} used {phase.used:.2f}, {phase.lost_s:.0f} s of it lost"


def _ends_on_text(last: EndsOn) -> str:
    rank = (
        f"the longest of {last.instances}"
        if last.longer == 0
        else f"{last.longer} of {last.instances} run longer"
    )
    return (
        f"ends on instance {last.instance} ({last.duration_s:.0f} s unthrottled, boot "
        f"included; {rank}), launched at "
        f"{last.launched_s:.0f} s: it could end no sooner than {last.soonest_s:.0f} s; "
        f"the pacer held it {last.paced_s:.0f} s and 429s {last.throttled_s:.0f} s"
    )


def format_trace(trace: PlannerTrace, every: int, notes: bool) -> str:
    """The summary, the phases and the ticks chosen by ``every`` as aligned text."""
    result = trace.result
    classes = [c for c in _CLASSES if any(c in k.limits for k in trace.ticks)]
    if result.get("makespan_s") is None:
        head = f"stalled at {_num(result.get('stalled_at_s'))} s"
    else:
        head = f"makespan {_num(result['makespan_s'])} s, ratio {result['ratio']}"
    lines = [
        f"{trace.scenario} (planner): {head}, lower bound {_num(result['lower_bound_s'])} s "
        f"(set by {trace.bound_by}); "
        f"{result['http_429']} 429s in {result['calls']:,} calls"
    ]
    lines.append("  " + "; ".join(_phase_text(trace, phase) for phase in trace.phases()))
    if trace.ends_on is not None:
        lines.append("  " + _ends_on_text(trace.ends_on))
    names = "/".join(c.replace("_tokens", "").replace("requests", "req") for c in classes)
    header = [
        "t",
        "live",
        "boot",
        "queue",
        "ceil",
        "binding",
        "belief",
        f"budget {names}",
        f"limit {names}",
        f"used {names}",
        "429s told -> hit",
    ]
    chosen: list[tuple[TickTrace, list[str]]] = []
    previous = None
    for index, tick in enumerate(trace.ticks):
        if index % every == 0 or tick.seen or tick.hit or tick.binding != previous:
            chosen.append((tick, _row(tick, classes)))
        previous = tick.binding
    widths = [len(h) for h in header]
    for _, row in chosen:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines.append("  ".join(h.rjust(w) for h, w in zip(header, widths, strict=True)).rstrip())
    for tick, row in chosen:
        lines.append("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if notes:
            lines.extend(f"      {note}" for note in tick.notes)
    return "\n".join(lines)


def _scenario(file: Path | None, random_seed: int | None, wide_seed: int | None) -> Scenario:
    from sim.generate import random_scenario
    from sim.generate_wide import wide_scenario
    from sim.scenario import load_scenario

    given = [x for x in (file, random_seed, wide_seed) if x is not None]
    if len(given) != 1:
        raise ConfigError(
            "bench trace", ["give exactly one of --scenario FILE, --random SEED, --wide SEED"]
        )
    if file is not None:
        return load_scenario(file)
    if random_seed is not None:
        return random_scenario(random_seed)
    assert wide_seed is not None
    return wide_scenario(wide_seed)


@click.command(name="trace")
@click.option(
    "--scenario",
    "file",
    type=click.Path(path_type=Path, dir_okay=False),
    help="Scenario file (YAML or JSON).",
)
@click.option(
    "--random",
    "random_seed",
    type=click.IntRange(0, 10**9),
    help="The random scenario of this seed (as `bench planner --random` draws them).",
)
@click.option(
    "--wide",
    "wide_seed",
    type=click.IntRange(0, 10**9),
    help="The wide scenario of this seed (as `bench planner --wide` draws them).",
)
@click.option(
    "--seed",
    type=click.IntRange(0, 2**32 - 1),
    help="Run the scenario file at this seed instead of its own.",
)
@click.option(
    "--every",
    type=click.IntRange(1, 10_000),
    default=20,
    show_default=True,
    help="Print every Nth tick (and every tick with a 429 or a new binding constraint).",
)
@click.option("--notes", is_flag=True, help="The controller's notes under each printed tick.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object with every tick.")
def bench_trace(
    file: Path | None,
    random_seed: int | None,
    wide_seed: int | None,
    seed: int | None,
    every: int,
    notes: bool,
    as_json: bool,
) -> None:
    """Trace the planner on one simulated scenario: why it met or missed its targets."""
    from sim.trace import trace_planner

    scenario = _scenario(file, random_seed, wide_seed)
    if seed is not None:
        if file is None:
            raise ConfigError("bench trace", ["--seed applies to a --scenario file only"])
        scenario = scenario.model_copy(update={"seed": seed, "name": f"{scenario.name}@{seed}"})
    trace = trace_planner(scenario)
    if as_json:
        click.echo(json.dumps(trace.as_json()))
    else:
        click.echo(format_trace(trace, every, notes))


def register(root: click.Group) -> None:
    group = root.commands["bench"]
    assert isinstance(group, click.Group)
    group.add_command(bench_trace)
