"""``evalfleet bench planner``: the planner against the baselines on simulated scenarios.

``--scenario FILE`` (repeatable) or ``--all`` (every file in the project's ``scenarios/``),
``--policy`` (repeatable: planner, aimd, fixed:N; default: the scenario's ``policies`` or
planner, aimd and three fixed:N), ``--json`` (one JSON object per scenario per line:
``{"scenario": NAME, "results": {POLICY: {...}}}``, the issue's format). ``--random N`` adds N
scenarios drawn by ``sim.generate.random_scenario`` (seeds 0..N-1, or from ``--random-from``):
scenarios the planner was not tuned on; ``--wide N`` adds N from the wider region of
``sim.generate_wide`` (off seeds, raises, two binding limits, wrong cache beliefs). ``--seed S``
(repeatable) runs each scenario file once per seed instead of at its own ``seed``, named ``NAME@S``: the same limits and harness, other
instances and timings. Under every table a verdict line names each target of
the benchmark the planner missed (``sim.targets``), and a final line counts the scenarios that met
them all. ``--jobs N`` simulates up to N scenarios at once, each in its own process: the
simulator is deterministic, so the tables are the same as with one and come in the same order.
``--decision-speed`` measures one planner decision for 10,000 live tasks instead. Bad scenario
files are a clear error, not a traceback.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click
import numpy as np

from evalfleet.commands.processes import spawned_map
from evalfleet.errors import ConfigError
from evalfleet.settings import PROJECT_ROOT
from sim.metrics import COLUMNS

if TYPE_CHECKING:
    from sim.bench import ScenarioResult
    from sim.scenario import Scenario

SCENARIO_DIR = PROJECT_ROOT / "scenarios"


def _scenario_files(files: tuple[Path, ...], all_: bool, random_n: int) -> list[Path]:
    paths = list(files)
    if all_:
        paths += sorted(SCENARIO_DIR.glob("*.yaml"))
    if not paths and random_n == 0:
        raise ConfigError(
            "bench planner", ["give --scenario FILE (repeatable), --all, --random N or --wide N"]
        )
    return paths


def _format_table(
    name: str, results: dict[str, dict[str, Any]], seconds: float, cpu_seconds: float
) -> str:
    cols = ["policy", *COLUMNS]
    rows = [[pol, *(_cell(r[c]) for c in COLUMNS)] for pol, r in results.items()]
    for row, r in zip(rows, results.values(), strict=True):
        if r.get("stalled_at_s") is not None:  # a retry livelock: no makespan
            row[1] = f"stalled@{r['stalled_at_s']:.0f}"
    widths = [max(len(str(x)) for x in col) for col in zip(cols, *rows, strict=True)]
    lines = [f"scenario {name}  (simulated in {seconds:.2f} s, {cpu_seconds:.2f} s CPU)"]
    lines.append("  ".join(c.rjust(w) for c, w in zip(cols, widths, strict=True)))
    for row in rows:
        lines.append("  ".join(str(c).rjust(w) for c, w in zip(row, widths, strict=True)))
    return "\n".join(lines)


def _simulate(
    job: tuple[Scenario, list[str] | None, float | None],
) -> ScenarioResult | tuple[str, list[str]]:
    """One scenario, in a worker process of ``--jobs``: its result, or the (source, problems)
    of the ConfigError it raised (an exception whose ``__init__`` takes two arguments does not
    survive the trip back through pickle)."""
    from sim.bench import run_scenario

    scenario, names, forecast_noise = job
    try:
        return run_scenario(scenario, names, forecast_noise)
    except ConfigError as exc:
        return exc.source, exc.problems


def _results(
    loaded: list[Scenario], names: list[str] | None, jobs: int, forecast_noise: float | None
) -> Iterator[ScenarioResult]:
    """Each scenario's result, in the order given; with ``jobs`` > 1 simulated in that many
    processes at once (``spawned_map``)."""
    work = [(scenario, names, forecast_noise) for scenario in loaded]
    for out in spawned_map(_simulate, work, jobs):
        if isinstance(out, tuple):
            raise ConfigError(*out)
        yield out


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def measure_decision_speed(live: int = 10_000, repeats: int = 50) -> dict[str, float]:
    """Median milliseconds of one planner decision for ``live`` running tasks (default curve)."""
    from planner.budgets import Budgets
    from planner.curves import default_curve
    from planner.sizing import Caps, Counting, FleetState, SizingConfig, decide, steady_state

    curve = default_curve()
    config = SizingConfig()
    counting = Counting()
    steady = steady_state(curve, counting, config.boot_s, config.integration_age_s)
    budgets = Budgets(
        calls_per_s=500.0, tokens_per_s=400_000.0, output_tokens_per_s=None, inflight_tokens=4e7
    )
    ages = np.random.default_rng(0).uniform(0.0, 1200.0, size=live)
    fleet = FleetState(now=0.0, ages=ages, booting=live // 10, queued=5 * live)
    timings = []
    for _ in range(repeats):
        started = time.perf_counter()
        decide(fleet, curve, budgets, counting, Caps(), config, steady)
        timings.append((time.perf_counter() - started) * 1000.0)
    cold_start = time.perf_counter()
    decide(fleet, curve, budgets, counting, Caps(), config)
    cold = (time.perf_counter() - cold_start) * 1000.0
    return {
        "live_tasks": float(live),
        "median_ms": float(np.median(timings)),
        "max_ms": float(np.max(timings)),
        "with_curve_integration_ms": cold,
    }


@click.command(name="planner")
@click.option(
    "--scenario",
    "scenarios",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False),
    help="Scenario file (YAML or JSON); repeatable.",
)
@click.option("--all", "all_", is_flag=True, help="Every scenario shipped in scenarios/.")
@click.option("--policy", "policies", multiple=True, help="planner, aimd or fixed:N; repeatable.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per scenario per line.")
@click.option(
    "--random",
    "random_n",
    type=click.IntRange(0, 1000),
    default=0,
    help="Also N random scenarios of the public format (sim.generate), unseen by the tuning.",
)
@click.option(
    "--wide",
    "wide_n",
    type=click.IntRange(0, 1000),
    default=0,
    help="Also N random scenarios from the wider region of sim.generate_wide (seeds as --random).",
)
@click.option(
    "--random-from",
    type=click.IntRange(0, 10**9),
    default=0,
    help="First seed of the --random scenarios (default 0).",
)
@click.option(
    "--seed",
    "seeds",
    multiple=True,
    type=click.IntRange(0, 2**32 - 1),
    help="Run each scenario file at this seed instead of its own (named NAME@SEED); repeatable.",
)
@click.option(
    "--jobs",
    type=click.IntRange(1, 64),
    default=1,
    help="Simulate up to N scenarios at once, one process each (default 1); same results, same order.",
)
@click.option(
    "--forecast-noise",
    type=click.FloatRange(0.0, 10.0),
    default=None,
    help="Launch every policy's instances in the order `launch_order: "
    "short_last` gives: each instance's calls times log-normal noise of this sigma "
    "(0: a perfect forecast). Default: the listed order, as a first run has it.",
)
@click.option(
    "--decision-speed", is_flag=True, help="Time one planner decision for 10,000 live tasks."
)
def bench_planner(
    scenarios: tuple[Path, ...],
    all_: bool,
    policies: tuple[str, ...],
    as_json: bool,
    random_n: int,
    wide_n: int,
    random_from: int,
    seeds: tuple[int, ...],
    jobs: int,
    forecast_noise: float | None,
    decision_speed: bool,
) -> None:
    """Simulate scenarios under the planner and the baselines; print the results table."""
    from sim.generate import random_scenario
    from sim.generate_wide import wide_scenario
    from sim.scenario import check_policy, load_scenario
    from sim.targets import violations

    if decision_speed:
        figures = measure_decision_speed()
        if as_json:
            click.echo(json.dumps({"decision_speed": figures}))
        else:
            click.echo(
                f"one planner decision, {int(figures['live_tasks']):,} live tasks: "
                f"median {figures['median_ms']:.2f} ms, max {figures['max_ms']:.2f} ms "
                f"({figures['with_curve_integration_ms']:.2f} ms integrating the curve too)"
            )
        return
    names = [check_policy(p) for p in policies] or None
    loaded = [load_scenario(path) for path in _scenario_files(scenarios, all_, random_n + wide_n)]
    if seeds:
        loaded = [
            s.model_copy(update={"seed": seed, "name": f"{s.name}@{seed}"})
            for s in loaded
            for seed in seeds
        ]
    loaded += [random_scenario(seed) for seed in range(random_from, random_from + random_n)]
    loaded += [wide_scenario(seed) for seed in range(random_from, random_from + wide_n)]
    met = judged = 0
    for scenario, result in zip(loaded, _results(loaded, names, jobs, forecast_noise), strict=True):
        missed = violations(result.results) if "planner" in result.results else None
        if missed is not None:
            judged += 1
            met += not missed
        if as_json:
            click.echo(json.dumps(result.as_json()))
            continue
        click.echo(
            _format_table(scenario.name, result.results, result.sim_seconds, result.cpu_seconds)
        )
        if missed is not None:
            click.echo(
                "  targets: " + ("all met" if not missed else "MISSED: " + "; ".join(missed))
            )
        click.echo()
    if judged and not as_json:
        click.echo(f"planner met every target on {met} of {judged} scenarios")


def register(root: click.Group) -> None:
    group = root.commands["bench"]
    assert isinstance(group, click.Group)
    group.add_command(bench_planner)
