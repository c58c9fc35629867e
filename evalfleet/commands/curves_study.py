"""``evalfleet curves split-study``: how often an 80/20 check of a trace's curve can pass at all.

The shipped default curve is checked once, on one deterministic 80/20 split of the trace
(``curves fit-default``). Whether a miss on that split says something about the fit or only about
the 100 held-out instances needs a reference: this command repeats the check on many other
random 80/20 splits (salts ``study-0``, ``study-1``, ...) and reports, per quantity, the share of
splits where every checked minute is within the tolerance, and the median absolute error per
minute, for three predictors of the held-out per-minute rates:

- ``fit``: the project's fit (``planner.fit.fit_curve``) on the 80%, as shipped;
- ``train-means``: the 80%'s own per-minute rates, unsmoothed (what a fit that follows every
  wiggle of its training data would predict);
- ``all-means``: the per-minute rates of *all* instances of the trace, the held-out ones
  included: an oracle no honest fit can beat, so its pass rate bounds what any estimator can
  reach on this trace with held-out sets of this size.

Splits never tune anything: the shipped split stays the one ``sim.traces.split_ids`` defines.
"""

from __future__ import annotations

import click
import numpy as np
import pandas as pd

from evalfleet.errors import ConfigError

PREDICTORS = ("fit", "train-means", "all-means")


def split_study(
    trace: str,
    splits: int,
    *,
    minutes: int = 8,
    tolerance: float = 0.15,
    quantities: tuple[str, ...] = (
        "calls_per_s",
        "input_tokens_per_s",
        "uncached_input_tokens_per_s",
    ),
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Return (pass rates: predictor x quantity, median |error|: (predictor, quantity) x minute).

    Errors are ``predicted / held-out observed - 1`` per minute of age, as ``check_curve``
    defines them.
    """
    from planner.curves import default_curve
    from planner.fit import check_curve, fit_curve
    from sim.traces import TRACE_HARNESS, load_calls, load_instances, split_trace

    harness = TRACE_HARNESS.get(trace)
    if harness is None:
        raise ConfigError("--trace", [f"unknown trace {trace!r}; shipped: {sorted(TRACE_HARNESS)}"])
    calls, instances = load_calls(trace), load_instances(trace)
    reference = default_curve()  # only its latency model matters for observed rates

    def observed(c: pd.DataFrame, i: pd.DataFrame) -> pd.DataFrame:
        check = check_curve(reference, c, i, n_bins=minutes)
        return check.pivot(index="bin_start_s", columns="quantity", values="observed")

    everyone = observed(calls, instances)
    errors: dict[tuple[str, str], list[np.ndarray]] = {}
    for k in range(splits):
        split = split_trace(calls, instances, salt=f"study-{k}")
        fitted = fit_curve(split.train_calls, harness, instances=split.train_instances).curve
        check = check_curve(fitted, split.test_calls, split.test_instances, n_bins=minutes)
        held_out = check.pivot(index="bin_start_s", columns="quantity", values="observed")
        predicted = {
            "fit": check.pivot(index="bin_start_s", columns="quantity", values="predicted"),
            "train-means": observed(split.train_calls, split.train_instances),
            "all-means": everyone,
        }
        for name, table in predicted.items():
            for q in quantities:
                err = (table[q] / held_out[q] - 1.0).to_numpy(dtype=np.float64)
                errors.setdefault((name, q), []).append(err)
    passes = pd.DataFrame(
        {
            q: [
                float(np.mean([np.abs(e).max() <= tolerance for e in errors[(name, q)]]))
                for name in PREDICTORS
            ]
            for q in quantities
        },
        index=list(PREDICTORS),
    )
    median_abs = pd.DataFrame(
        {key: np.median(np.abs(np.vstack(errs)), axis=0) for key, errs in errors.items()},
        index=[f"min {m}" for m in range(minutes)],
    ).T
    return passes, median_abs


@click.command(name="split-study")
@click.option(
    "--trace",
    default="minisweagent-gemini3pro-verified",
    show_default=True,
    help="Shipped trace under sim/traces.",
)
@click.option(
    "--splits",
    type=click.IntRange(1, 5_000),
    default=200,
    show_default=True,
    help="Random 80/20 splits to check (about 0.2 s each).",
)
def split_study_command(trace: str, splits: int) -> None:
    """Check the default curve's fit on many random 80/20 splits, against two references."""
    passes, median_abs = split_study(trace, splits)
    click.echo(
        f"{splits} random 80/20 splits of {trace}: share of splits where every minute 0-7 is "
        "within 15% of the held-out 20%"
    )
    click.echo(passes.round(3).to_string())
    click.echo("median |predicted / held-out - 1| per minute of age, %:")
    click.echo((median_abs * 100).round(1).to_string())
