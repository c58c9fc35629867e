"""The ``evalfleet curves`` group: per-harness usage curves.

``curves fit-default`` refits the shipped default curve of ``mini-swe-agent`` from the public
traces in ``sim/traces`` (80% of the instances, chosen deterministically), checks it on the other
20% (per minute of age, per running task) and rewrites ``planner/default_curves/<harness>.json``
with the fitted parameters and the measured check. The ledger-backed ``curves fit`` and
``curves show`` come with the ledger.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import click
import pandas as pd

from evalfleet.errors import ConfigError

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "planner" / "default_curves"
CHECK_MINUTES = 8
CHECK_TOLERANCE = 0.15
CHECK_QUANTITIES = ("calls_per_s", "input_tokens_per_s", "uncached_input_tokens_per_s")


def fit_default_params(
    trace: str, *, test_share: float = 0.2
) -> tuple[dict[str, Any], pd.DataFrame]:
    """Fit the default curve of ``trace``'s harness; return (params, per-minute check table)."""
    from planner.fit import check_curve, fit_curve
    from sim.traces import SPLIT_SALT, TRACE_HARNESS, load_calls, load_instances, split_trace

    harness = TRACE_HARNESS.get(trace)
    if harness is None:
        raise ConfigError("--trace", [f"unknown trace {trace!r}; shipped: {sorted(TRACE_HARNESS)}"])
    split = split_trace(load_calls(trace), load_instances(trace), test_share=test_share)
    fitted = fit_curve(split.train_calls, harness, instances=split.train_instances)
    check = check_curve(fitted.curve, split.test_calls, split.test_instances, n_bins=CHECK_MINUTES)
    worst = {
        q: float(check.loc[check.quantity == q, "rel_error"].abs().max())
        for q in check.quantity.unique()
    }
    info = {
        "source": f"sim/traces/{trace}",
        "split": {"salt": SPLIT_SALT, "test_share": test_share},
        "train_instances": fitted.instance_count,
        "train_calls": fitted.sample_count,
        "test_instances": int(split.test_instances.shape[0]),
        "quality": fitted.quality,
        "check": {
            "bin_s": 60.0,
            "minutes": CHECK_MINUTES,
            "max_abs_rel_error": worst,
            "rel_error_per_minute": {
                q: [round(float(x), 4) for x in check.loc[check.quantity == q, "rel_error"]]
                for q in check.quantity.unique()
            },
        },
    }
    params = fitted.curve.to_params()
    params["fit"] = info
    return params, check


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@click.group(name="curves")
def curves() -> None:
    """Per-harness usage curves (calls, tokens, in-flight tokens and survival by task age)."""


@curves.command(name="fit-default")
@click.option(
    "--trace",
    default="minisweagent-gemini3pro-verified",
    show_default=True,
    help="Shipped trace under sim/traces to fit from.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_OUT,
    show_default=True,
    help="Folder to write <harness>.json into.",
)
@click.option("--dry-run", is_flag=True, help="Fit and check, print, but write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the check as JSON.")
def fit_default(trace: str, out_dir: Path, dry_run: bool, as_json: bool) -> None:
    """Refit the shipped default curve from the traces (80%) and check it on the other 20%."""
    params, check = fit_default_params(trace)
    path = out_dir / f"{params['harness']}.json"
    if not dry_run:
        _write_atomic(path, json.dumps(params, indent=1, sort_keys=True) + "\n")
    if as_json:
        click.echo(
            json.dumps({"path": str(path), "written": not dry_run, "check": params["fit"]["check"]})
        )
        return
    table = check.pivot(index="bin_start_s", columns="quantity", values="rel_error")
    click.echo(
        f"fitted {params['harness']} on {params['fit']['train_instances']} instances "
        f"({params['fit']['train_calls']} calls); checked on "
        f"{params['fit']['test_instances']} held-out instances"
    )
    click.echo("relative error of the curve per minute of age (predicted / observed - 1):")
    click.echo((table * 100).round(1).to_string())
    for q in CHECK_QUANTITIES:
        worst = params["fit"]["check"]["max_abs_rel_error"][q]
        verdict = "ok" if worst <= CHECK_TOLERANCE else "OVER TOLERANCE"
        click.echo(f"{q}: worst {worst * 100:.1f}% ({verdict}, tolerance {CHECK_TOLERANCE:.0%})")
    click.echo(("would write " if dry_run else "wrote ") + str(path))


def register(root: click.Group) -> None:
    root.add_command(curves)
