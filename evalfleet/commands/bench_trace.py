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

``--count N`` traces N generated scenarios from the seed given (``--random`` or ``--wide``),
``--jobs`` at once, and prints one line per run instead of ticks (``sim.trace_summary``): where
it lost its time, and the instance it ended on; then the batch's tally. ``--baselines FILE``
(``bench planner --json`` output with every policy, repeatable) judges each run against them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from evalfleet.commands.processes import spawned_map
from evalfleet.errors import ConfigError

if TYPE_CHECKING:
    from sim.scenario import Scenario
    from sim.trace import EndsOn, Phase, PlannerTrace, TickTrace
    from sim.trace_summary import BatchTally, TraceRow

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


_ROW_HEAD = (
    f"{'scenario':<14} {'ratio':>6} {'429s':>5} {'bound by':<16} {'queued':>7} {'tail':>7} "
    f"{'tail':>7} {'last:':>6} {'launched':>8} {'soonest':>7} {'held':>11}  verdict\n"
    f"{'':<14} {'':>6} {'':>5} {'':<16} {'lost s':>7} {'s':>7} {'lost s':>7} {'longer':>6} "
    f"{'before':>8} {'/bound':>7} {'pacer+429':>11}"
)


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def _row_text(row: TraceRow) -> str:
    verdict = "" if row.missed is None else ("met" if not row.missed else "; ".join(row.missed))
    held = (
        "-"
        if row.paced_s is None or row.throttled_s is None
        else f"{row.paced_s:.0f}+{row.throttled_s:.0f}"
    )
    soonest = "-" if row.soonest_over_bound is None else f"{row.soonest_over_bound:.3f}"
    ratio = "-" if row.ratio is None else f"{row.ratio:.3f}"
    return (
        f"{row.scenario:<14} {ratio:>6} {row.http_429:>5} {row.bound_by:<16} "
        f"{_seconds(row.queued_lost_s):>7} {row.tail_s:>7.0f} {_seconds(row.tail_lost_s):>7} "
        f"{'-' if row.longer is None else row.longer:>6} "
        f"{_seconds(row.launched_before_empty_s):>8} {soonest:>7} {held:>11}  {verdict}"
    ).rstrip()


def _tally_text(label: str, t: BatchTally) -> str:
    from sim.targets import MAX_RATIO
    from sim.trace_summary import NEAR_EMPTY_S, TOP

    held = "-" if t.median_held_s is None else f"{t.median_held_s:.0f} s"
    return (
        f"{label}: {t.runs} run{'' if t.runs == 1 else 's'}. The tail lost more than the "
        f"queued phase in {t.tail_loses_more}. The run ended on the longest instance in "
        f"{t.ends_on_longest}, on one of the {TOP} longest in {t.ends_on_top}; that instance "
        f"was launched within "
        f"{NEAR_EMPTY_S:.0f} s of the queue emptying in {t.launched_near_empty}, and its "
        f"launch plus its unthrottled duration alone is over {MAX_RATIO:.2f}x the lower bound "
        f"in {t.soonest_over_ratio}. The pacer and 429s held it {held} (median)."
    )


def _trace_one(job: tuple[Scenario, Mapping[str, Any] | None, float | None]) -> TraceRow:
    """One scenario traced, in short (in a worker process of ``--jobs``)."""
    from sim.trace import trace_planner
    from sim.trace_summary import trace_row

    scenario, baselines, forecast_noise = job
    return trace_row(trace_planner(scenario, forecast_noise=forecast_noise), baselines)


def _batch(
    scenarios: list[Scenario],
    baseline_files: tuple[Path, ...],
    jobs: int,
    as_json: bool,
    forecast_noise: float | None,
) -> None:
    from sim.compare import read_results
    from sim.trace_summary import tally

    baselines = read_results(baseline_files) if baseline_files else None
    jobs_in = [
        (s, baselines.get(s.name) if baselines is not None else None, forecast_noise)
        for s in scenarios
    ]
    if not as_json:
        click.echo(_ROW_HEAD)
    rows = []
    for row in spawned_map(_trace_one, jobs_in, jobs):
        rows.append(row)
        click.echo(json.dumps(row.as_json()) if as_json else _row_text(row))
    missed = [r for r in rows if r.missed]
    judged = [r for r in rows if r.missed is not None]
    if as_json:
        summary = {
            "tally": tally(rows).as_json(),
            "judged": len(judged),
            "met": len(judged) - len(missed),
            "tally_missed": tally(missed).as_json() if judged else None,
        }
        click.echo(json.dumps(summary))
        return
    click.echo()
    click.echo(_tally_text("all", tally(rows)))
    if baselines is not None:
        unjudged = len(rows) - len(judged)
        click.echo(
            f"met every target: {len(judged) - len(missed)} of {len(judged)} judged"
            + (f" ({unjudged} not in --baselines)" if unjudged else "")
        )
        if missed:
            click.echo(_tally_text("missed", tally(missed)))


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
    help="Print every Nth tick (and every tick with a 429 or a new binding constraint). "
    "[default: 20]",
)
@click.option("--notes", is_flag=True, help="The controller's notes under each printed tick.")
@click.option(
    "--count",
    type=click.IntRange(1, 100_000),
    help="Trace N generated scenarios from the --random or --wide seed: one line per run.",
)
@click.option(
    "--jobs",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="With --count: trace up to N scenarios at once, one process each.",
)
@click.option(
    "--baselines",
    "baseline_files",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="With --count: `bench planner --json` output with every policy, to judge each run "
    "by (repeatable).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="One JSON object with every tick (with --count: one per run, then the tally).",
)
@click.option(
    "--forecast-noise",
    type=click.FloatRange(0.0, 10.0),
    default=None,
    help="Launch the instances as `launch_order: short_last` does (as `bench planner --forecast-noise`).",
)
def bench_trace(
    file: Path | None,
    random_seed: int | None,
    wide_seed: int | None,
    seed: int | None,
    every: int | None,
    notes: bool,
    count: int | None,
    jobs: int,
    baseline_files: tuple[Path, ...],
    as_json: bool,
    forecast_noise: float | None,
) -> None:
    """Trace the planner on one simulated scenario: why it met or missed its targets."""
    from sim.trace import trace_planner

    if count is not None:
        _check_batch(file, every, notes)
        _batch(
            _generated(random_seed, wide_seed, count),
            baseline_files,
            jobs,
            as_json,
            forecast_noise,
        )
        return
    if baseline_files or jobs != 1:
        raise ConfigError("bench trace", ["--jobs and --baselines apply with --count only"])
    scenario = _scenario(file, random_seed, wide_seed)
    if seed is not None:
        if file is None:
            raise ConfigError("bench trace", ["--seed applies to a --scenario file only"])
        scenario = scenario.model_copy(update={"seed": seed, "name": f"{scenario.name}@{seed}"})
    trace = trace_planner(scenario, forecast_noise=forecast_noise)
    if as_json:
        click.echo(json.dumps(trace.as_json()))
    else:
        click.echo(format_trace(trace, every or 20, notes))


def _check_batch(file: Path | None, every: int | None, notes: bool) -> None:
    problems = []
    if file is not None:
        problems.append("--count applies to --random SEED or --wide SEED, not --scenario")
    if every is not None or notes:
        problems.append("--every and --notes print one run's ticks, not with --count")
    if problems:
        raise ConfigError("bench trace", problems)


def _generated(random_seed: int | None, wide_seed: int | None, count: int) -> list[Scenario]:
    from sim.generate import random_scenario
    from sim.generate_wide import wide_scenario

    if (random_seed is None) == (wide_seed is None):
        raise ConfigError(
            "bench trace", ["--count needs exactly one of --random SEED, --wide SEED"]
        )
    if random_seed is not None:
        return [random_scenario(s) for s in range(random_seed, random_seed + count)]
    assert wide_seed is not None
    return [wide_scenario(s) for s in range(wide_seed, wide_seed + count)]


def register(root: click.Group) -> None:
    group = root.commands["bench"]
    assert isinstance(group, click.Group)
    group.add_command(bench_trace)
