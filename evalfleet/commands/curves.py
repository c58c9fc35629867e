"""The ``evalfleet curves`` group: per-harness usage curves.

``curves fit-default`` refits the shipped default curve of ``mini-swe-agent`` from the public
traces in ``sim/traces`` (80% of the instances, chosen deterministically), checks it on the other
20% (per minute of age, per running task) and rewrites ``planner/default_curves/<harness>.json``
with the fitted parameters and the measured check.

``curves fit-simulated`` refits the shipped default curve of the ``simulated`` harness offline:
instances of the harness's own conversation model answered by the simulated provider's token,
caching and latency model (``harnesses.simulated_calls``), by default with the options and
provider profile of ``evalfleet demo``; it checks the fit on instances drawn under another run
id and rewrites ``planner/default_curves/simulated.json``. Deterministic: the same command gives
the same file.

``curves fit --harness H [--since ...] [--until ...] [--write] [--json]`` refits a harness from
the ledger's ``llm_calls`` (``analysis.refit``: instances that ran entirely in the window),
compares the fit and the version in use per minute of task age, and with ``--write`` stores it
as the next ``harness_curves`` version, which the planner loop picks up at its next tick.
``curves show [--harness H]`` lists the stored versions. ``curves split-study`` repeats the
80/20 check on many random splits (``evalfleet.commands.curves_study``).
"""

from __future__ import annotations

import json
import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
import pandas as pd
from sqlalchemy import Engine

from evalfleet.errors import ConfigError

DEFAULT_OUT = Path(__file__).resolve().parents[2] / "planner" / "default_curves"
CHECK_MINUTES = 8
CHECK_TOLERANCE = 0.15
CHECK_QUANTITIES = ("calls_per_s", "input_tokens_per_s", "uncached_input_tokens_per_s")
CHECK_BOOTSTRAP = 2000  # resamples of the held-out instances for the observed rates' 95% interval


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
    check = check_curve(
        fitted.curve,
        split.test_calls,
        split.test_instances,
        n_bins=CHECK_MINUTES,
        bootstrap=CHECK_BOOTSTRAP,
    )
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
            "held_out_alive": [int(x) for x in check.loc[check.quantity == "calls_per_s", "alive"]],
            "held_out_observed_95": {
                q: [
                    [round(float(lo), 4), round(float(hi), 4)]
                    for lo, hi in check.loc[
                        check.quantity == q, ["observed_lo", "observed_hi"]
                    ].itertuples(index=False)
                ]
                for q in CHECK_QUANTITIES
            },
            "bootstrap": {"resamples": CHECK_BOOTSTRAP, "seed": 0, "unit": "held-out instance"},
        },
    }
    params = fitted.curve.to_params()
    params["fit"] = info
    return params, check


SIMULATED_INSTANCES = 1_000
SIMULATED_CHECK_INSTANCES = 400
SIMULATED_BIN_S = 5.0  # the planner's own age bin; the demo's tasks live ~12 s
SIMULATED_CHECK_BINS = 5
SIMULATED_CALL_OVERHEAD_S = 0.02  # gateway + HTTP hops per call on top of the provider's latency


def fit_simulated_params(
    options: dict[str, Any] | None = None,
    *,
    instances: int = SIMULATED_INSTANCES,
    call_overhead_s: float = SIMULATED_CALL_OVERHEAD_S,
    bin_s: float = SIMULATED_BIN_S,
) -> tuple[dict[str, Any], pd.DataFrame]:
    """Fit the ``simulated`` harness's default curve offline; return (params, check table).

    ``options``: the harness options to model (default: the demo's); the provider is the demo's
    profile (latency and output model). The check plays ``SIMULATED_CHECK_INSTANCES`` other
    instances (another run id) and compares per ``bin_s`` of age.
    """
    from evalfleet.commands.demo import HARNESS_OPTIONS, demo_profile
    from harnesses.simulated import SimulatedHarness
    from harnesses.simulated_calls import OFFLINE_RUN_ID, offline_calls
    from planner.fit import check_curve, fit_curve

    chosen = dict(HARNESS_OPTIONS if options is None else options)
    resolved = SimulatedHarness(chosen, source="--options").options.model_dump()
    profile = demo_profile()
    calls, ends = offline_calls(chosen, profile, instances, call_overhead_s=call_overhead_s)
    check_run = f"{OFFLINE_RUN_ID}-check"
    test_calls, test_ends = offline_calls(
        chosen,
        profile,
        SIMULATED_CHECK_INSTANCES,
        run_id=check_run,
        call_overhead_s=call_overhead_s,
    )
    fitted = fit_curve(
        calls,
        "simulated",
        instances=ends,
        bin_s=bin_s,
        survival_step_s=1.0,
        latency_base_s=profile.latency_s + call_overhead_s,
        latency_per_output_token_s=profile.latency_per_output_token_s,
    )
    check = check_curve(
        fitted.curve, test_calls, test_ends, bin_s=bin_s, n_bins=SIMULATED_CHECK_BINS
    )
    worst = {
        q: float(check.loc[check.quantity == q, "rel_error"].abs().max())
        for q in check.quantity.unique()
    }
    params = fitted.curve.to_params()
    params["fit"] = {
        "source": "harnesses.simulated_calls (offline: the harness's conversation model answered "
        "by the simulated provider's token, cache and latency model)",
        "command": "evalfleet curves fit-simulated",
        "options": resolved,
        "provider": {
            "latency_s": profile.latency_s,
            "latency_per_output_token_s": profile.latency_per_output_token_s,
            "output_fraction_min": profile.output_fraction_min,
            "output_fraction_max": profile.output_fraction_max,
            "seed": profile.seed,
        },
        "call_overhead_s": call_overhead_s,
        "run_id": OFFLINE_RUN_ID,
        "train_instances": fitted.instance_count,
        "train_calls": fitted.sample_count,
        "test_instances": SIMULATED_CHECK_INSTANCES,
        "test_run_id": check_run,
        "quality": fitted.quality,
        "check": {
            "bin_s": bin_s,
            "bins": SIMULATED_CHECK_BINS,
            "max_abs_rel_error": worst,
            "rel_error_per_bin": {
                q: [round(float(x), 4) for x in check.loc[check.quantity == q, "rel_error"]]
                for q in check.quantity.unique()
            },
        },
    }
    return params, check


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o644)  # a shipped file, readable by all (mkstemp makes it 0600)
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
    click.echo(
        "checked quantities per minute: held-out tasks alive at the minute's start, predicted, "
        "observed and its 95% bootstrap interval (held-out instances resampled):"
    )
    detail = check[check.quantity.isin(CHECK_QUANTITIES)].assign(
        minute=lambda d: (d.bin_start_s // 60).astype(int)
    )
    click.echo(
        detail.set_index(["quantity", "minute"])[
            ["alive", "predicted", "observed", "observed_lo", "observed_hi"]
        ]
        .round(3)
        .to_string()
    )
    for q in CHECK_QUANTITIES:
        worst = params["fit"]["check"]["max_abs_rel_error"][q]
        verdict = "ok" if worst <= CHECK_TOLERANCE else "OVER TOLERANCE"
        click.echo(f"{q}: worst {worst * 100:.1f}% ({verdict}, tolerance {CHECK_TOLERANCE:.0%})")
    click.echo(("would write " if dry_run else "wrote ") + str(path))


@curves.command(name="fit-simulated")
@click.option(
    "--options",
    "options_json",
    default=None,
    metavar="JSON",
    help="Harness options to model (a JSON object). Default: the demo's.",
)
@click.option(
    "--instances",
    type=click.IntRange(20, 100_000),
    default=SIMULATED_INSTANCES,
    show_default=True,
    help="Offline instances to fit from.",
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_OUT,
    show_default=True,
    help="Folder to write simulated.json into.",
)
@click.option("--dry-run", is_flag=True, help="Fit and check, print, but write nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the check as JSON.")
def fit_simulated(
    options_json: str | None, instances: int, out_dir: Path, dry_run: bool, as_json: bool
) -> None:
    """Refit the shipped curve of the `simulated` harness offline (no network, deterministic)."""
    options: dict[str, Any] | None = None
    if options_json is not None:
        try:
            options = json.loads(options_json)
        except json.JSONDecodeError as exc:
            raise ConfigError("--options", [f"not JSON: {exc.msg}"]) from None
        if not isinstance(options, dict):
            raise ConfigError("--options", ["must be a JSON object"])
    params, check = fit_simulated_params(options, instances=instances)
    path = out_dir / "simulated.json"
    if not dry_run:
        _write_atomic(path, json.dumps(params, indent=1, sort_keys=True) + "\n")
    info = params["fit"]
    if as_json:
        click.echo(json.dumps({"path": str(path), "written": not dry_run, "check": info["check"]}))
        return
    click.echo(
        f"fitted simulated on {info['train_instances']} offline instances "
        f"({info['train_calls']} calls, options {json.dumps(info['options'], sort_keys=True)}); "
        f"checked on {info['test_instances']} others"
    )
    table = check.pivot(index="bin_start_s", columns="quantity", values="rel_error")
    click.echo(
        f"relative error per {info['check']['bin_s']:g} s of age (predicted / observed - 1):"
    )
    click.echo((table * 100).round(1).to_string())
    click.echo(("would write " if dry_run else "wrote ") + str(path))


def _ledger_engine() -> Engine:
    from evalfleet.settings import get_settings
    from ledger.db import make_engine

    return make_engine(get_settings().ledger_url, pool_size=1, max_overflow=0)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.1f}%"


@curves.command(name="fit")
@click.option("--harness", required=True, help="Harness to refit (runs.harness / llm_calls).")
@click.option(
    "--since", default=None, help="Window start: ISO 8601 time (naive = UTC) or a duration ago "
    "(30m, 6h, 2d). Default: the beginning of the ledger."
)  # fmt: skip
@click.option("--until", default=None, help="Window end, same forms as --since. Default: now.")
@click.option(
    "--min-instances",
    type=click.IntRange(1, 1_000_000),
    default=20,
    show_default=True,
    help="Refuse to fit from fewer finished instances than this.",
)
@click.option("--write", is_flag=True, help="Store the fit as the harness's next curve version.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def fit(
    harness: str,
    since: str | None,
    until: str | None,
    min_instances: int,
    write: bool,
    as_json: bool,
) -> None:
    """Refit a harness's usage curve from the ledger and compare it with the version in use."""
    from analysis.refit import parse_when, refit, write_refit

    now = datetime.now(UTC)
    since_at = parse_when(since, now, option="--since") if since is not None else None
    until_at = parse_when(until, now, option="--until") if until is not None else None
    engine = _ledger_engine()
    try:
        result = refit(engine, harness, since_at, until_at, min_instances=min_instances)
        version = write_refit(engine, result) if write else None
    finally:
        engine.dispose()
    current = result.current
    if as_json:
        click.echo(
            json.dumps(
                {
                    "harness": harness,
                    "window": result.window.describe(),
                    "sample_count": result.fit.sample_count,
                    "instances": result.fit.instance_count,
                    "max_abs_rel_error": result.worst_errors("new"),
                    "current_version": current.version if current else None,
                    "current_max_abs_rel_error": result.worst_errors("current"),
                    "written_version": version,
                }
            )
        )
        return
    window = result.window
    click.echo(
        f"fitted {harness} from {window.instance_count} instances ({window.call_count} calls)"
    )
    left_out = {k: v for k, v in window.dropped.items() if v}
    if left_out:
        click.echo("left out: " + ", ".join(f"{k} {v}" for k, v in left_out.items()))
    cmp = result.comparison
    for which, label in (("new", "new fit"), ("current", "in use")):
        col = f"rel_error_{which}"
        if col not in cmp.columns:
            continue
        if which == "current" and current is not None:
            label = f"in use (version {current.version}, {current.source})"
        table = cmp.pivot(index="bin_start_s", columns="quantity", values=col)
        table.index = [f"min {int(i // 60)}" for i in table.index]
        click.echo(f"{label}: relative error per minute of age (predicted / observed - 1, %):")
        click.echo((table * 100).round(1).to_string())
    worst_new = result.worst_errors("new").get("input_tokens_per_s")
    worst_cur = result.worst_errors("current").get("input_tokens_per_s")
    click.echo(f"input tokens/s worst minute: new fit {_pct(worst_new)}, in use {_pct(worst_cur)}")
    if version is not None:
        click.echo(f"wrote {harness} curve version {version}")
    else:
        click.echo("not written (use --write to store it as the next version)")


@curves.command(name="show")
@click.option("--harness", default=None, help="Only this harness.")
@click.option("--json", "as_json", is_flag=True, help="Print the versions as JSON.")
def show(harness: str | None, as_json: bool) -> None:
    """List the stored curve versions (newest per harness is what the planner uses)."""
    from ledger.curves import list_versions

    engine = _ledger_engine()
    try:
        versions = list_versions(engine, harness)
    finally:
        engine.dispose()
    if as_json:
        click.echo(
            json.dumps(
                [
                    {
                        "harness": v.harness,
                        "version": v.version,
                        "sample_count": v.sample_count,
                        "instances": v.fit_quality.get("instances"),
                        "source": v.source,
                        "created_at": v.created_at.isoformat(),
                        "max_abs_rel_error": v.fit_quality.get("max_abs_rel_error", {}),
                    }
                    for v in versions
                ]
            )
        )
        return
    if not versions:
        scope = f"harness {harness!r}" if harness else "any harness"
        click.echo(f"no stored curve versions for {scope}; the planner uses the shipped default")
        return
    latest = {v.harness: v.version for v in versions}
    for v in versions:
        worst = v.fit_quality.get("max_abs_rel_error", {}).get("input_tokens_per_s")
        mark = "  <- in use" if latest[v.harness] == v.version else ""
        click.echo(
            f"{v.harness}  v{v.version}  {v.created_at:%Y-%m-%d %H:%M:%S}Z  "
            f"{v.sample_count} calls  {v.fit_quality.get('instances', '?')} instances  "
            f"input tokens/s worst {_pct(worst)}  {v.source}{mark}"
        )


def register(root: click.Group) -> None:
    from evalfleet.commands.curves_study import split_study_command

    curves.add_command(split_study_command)
    root.add_command(curves)
