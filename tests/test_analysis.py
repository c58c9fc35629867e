"""analysis/: the simulated-run ledger fill, the refit logic and plots, and the run timeline
figures (checked on the Figure objects and on the PNG files they are saved as)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.image
import numpy as np
import pandas as pd
import pytest
from sqlalchemy import Engine, func, select

from analysis.refit import observed_by_age, parse_when, plot_refit, refit, write_refit
from analysis.simfill import DEMO_SCENARIO, SimulatedRun, simulate
from analysis.timeline import (
    TIME_LABEL,
    load_timeline,
    per_minute,
    png_size,
    save_figures,
    timeline_figures,
)
from evalfleet.errors import ConfigError, NotFound
from ledger.curve_window import load_fit_window
from ledger.curves import latest_curve
from ledger.models import AuditLog, InstanceResult, LlmCall, PlannerDecision
from planner.curves import default_curve
from planner.decision import Binding
from planner.fit import check_curve
from sim.scenario import parse_scenario
from tests.analysis_fixtures import START, sim_engine, sim_ledger, sim_run  # noqa: F401

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
#: The limit types an OpenAI-style 429 can name (requests per minute, tokens per minute,
#: and output tokens when it states a token limit other than the header's): those of the demo's
#: provider.
DEMO_LIMIT_TYPES = {"requests", "tokens", "output_tokens"}


# ----------------------------------------------------------------------------- simfill


def test_simulated_run_records_are_consistent(sim_run: SimulatedRun) -> None:  # noqa: F811
    calls, inst = sim_run.calls, sim_run.instances
    assert inst.shape[0] == sim_run.scenario.instances
    ok = calls[calls["status"] == 200]
    assert (calls["status"].isin([200, 429])).all()
    # Every 429 is typed with a limit an OpenAI-style provider names; which one the planner
    # meets depends on its tuning. A 429 carries no tokens; an answered call no limit type.
    throttled = calls["status"] == 429
    assert set(calls.loc[throttled, "limit_type"]) <= DEMO_LIMIT_TYPES
    assert calls.loc[~throttled, "limit_type"].isna().all()
    assert (calls.loc[throttled, ["input_tokens", "output_tokens"]] == 0).all().all()
    sums = ok.groupby("instance")[["input_tokens", "output_tokens", "cost_micro_usd"]].sum()
    np.testing.assert_array_equal(sums["input_tokens"], inst["input_tokens"])
    np.testing.assert_array_equal(sums["cost_micro_usd"], inst["cost_micro_usd"])
    assert (ok.groupby("instance").size().to_numpy() == inst["calls"].to_numpy()).all()
    # Every instance starts with its first request (age 0), after its boot, and ends later.
    assert calls.groupby("instance")["task_age_s"].min().max() == pytest.approx(0.0)
    assert (inst["launched_s"] <= inst["started_s"]).all()
    assert (inst["ended_s"] > inst["started_s"]).all()
    assert inst["ended_s"].max() == pytest.approx(sim_run.makespan_s)
    assert (calls["pacer_wait_s"] >= -1e-9).all()
    # Every tick recorded the planner's decision, naming one of the planner's constraints; only
    # a 429 freezes launches (cooldown).
    bindings = {t["decision"]["binding"] for t in sim_run.ticks.to_dict("records")}
    assert bindings <= {b.value for b in Binding}
    assert "cooldown" not in bindings or throttled.any()


def test_a_hidden_output_limit_is_recorded_as_typed_429s() -> None:
    """Which limit a run meets is forced here, independent of the planner's tuning: a fixed
    fleet (a policy that ignores headers) against an Anthropic-style provider whose only
    binding limit is output tokens. Every 429 is recorded as the ``output_tokens`` the gateway
    classifies, with no tokens, and is retried: every instance still gets its calls answered."""
    data = {
        **DEMO_SCENARIO,
        "instances": 12,
        "provider": {
            "rpm": 1_000_000,
            "input_tpm": 1_000_000_000,
            "output_tpm": 6_000,
            "headers": "anthropic",
        },
    }
    run = simulate(parse_scenario(data, "output-only scenario"), policy="fixed:12")
    calls = run.calls
    throttled = calls["status"] == 429
    assert throttled.sum() > 0
    assert set(calls.loc[throttled, "limit_type"]) == {"output_tokens"}
    assert (calls.loc[throttled, ["input_tokens", "output_tokens"]] == 0).all().all()
    answered = calls[~throttled].groupby("instance").size()
    assert answered.to_numpy().tolist() == run.instances["calls"].to_numpy().tolist()
    assert run.instances["calls"].min() > 0


def test_simulated_run_lands_in_every_table(
    sim_engine: Engine,  # noqa: F811
    sim_ledger: tuple[str, str],  # noqa: F811
    sim_run: SimulatedRun,  # noqa: F811
) -> None:
    _, run_id = sim_ledger
    with sim_engine.connect() as conn:
        n_calls = conn.execute(
            select(func.count()).select_from(LlmCall).where(LlmCall.run_id == run_id)
        ).scalar_one()
        states: dict[str, int] = dict(
            conn.execute(
                select(InstanceResult.state, func.count())
                .where(InstanceResult.run_id == run_id)
                .group_by(InstanceResult.state)
            )
            .tuples()
            .all()
        )
        n_decisions = conn.execute(select(func.count()).select_from(PlannerDecision)).scalar_one()
        actions = conn.execute(select(AuditLog.action).order_by(AuditLog.at)).scalars().all()
    assert n_calls == sim_run.calls.shape[0]
    assert set(states) == {"resolved", "unresolved"}
    assert sum(states.values()) == sim_run.scenario.instances
    assert n_decisions == sim_run.ticks.shape[0]
    assert actions == ["run.launch", "provider.limit_change", "run.close"]


# ----------------------------------------------------------------------------- refit


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30m", NOW - timedelta(minutes=30)),
        ("6h", NOW - timedelta(hours=6)),
        ("1.5d", NOW - timedelta(hours=36)),
        ("2026-01-05T12:00", datetime(2026, 1, 5, 12, 0, tzinfo=UTC)),
        ("2026-01-05T13:00+01:00", datetime(2026, 1, 5, 12, 0, tzinfo=UTC)),
        ("2026-01-05T12:00Z", datetime(2026, 1, 5, 12, 0, tzinfo=UTC)),
    ],
)
def test_parse_when_reads_iso_times_and_durations(text: str, expected: datetime) -> None:
    assert parse_when(text, NOW) == expected


@pytest.mark.parametrize("text", ["yesterday", "-5m", "5 parsecs", "", "99999999w"])
def test_parse_when_rejects_other_text_naming_the_option(text: str) -> None:
    with pytest.raises(ConfigError, match="--until"):
        parse_when(text, NOW, option="--until")


def test_observed_rates_are_events_over_alive_task_seconds() -> None:
    calls = pd.DataFrame(
        {
            "instance_id": ["a", "a", "b"],
            "t_request_s": [10.0, 70.0, 30.0],
            "input_tokens": [1000, 3000, 2000],
            "cached_input_tokens": [0, 1500, 0],
            "output_tokens": [10, 10, 20],
        }
    )
    instances = pd.DataFrame({"instance_id": ["a", "b"], "wall_time_s": [120.0, 60.0]})
    obs = observed_by_age(calls, instances)
    assert obs["exposure_task_s"].tolist() == [120.0, 60.0]
    assert obs["calls_per_s"].tolist() == pytest.approx([2 / 120, 1 / 60])
    assert obs["input_tokens_per_s"].tolist() == pytest.approx([3000 / 120, 3000 / 60])
    assert obs["cached_share"].tolist() == pytest.approx([0.0, 0.5])
    assert obs["survival"].tolist() == [1.0, 0.5]


def test_refit_of_a_paced_run_recovers_the_unthrottled_demand(
    sim_engine: Engine,  # noqa: F811
) -> None:
    """The simulated workload is drawn from the trace the shipped default was fitted on; the
    run was paced and throttled. On the task's own clock its rates match the default (minutes
    0-3, where most of the 80 tasks are alive); on wall-clock ages they look far lower."""
    own = load_fit_window(sim_engine, "mini-swe-agent")
    wall = load_fit_window(sim_engine, "mini-swe-agent", unthrottled=False)
    assert own.throttle_s > 0 and own.instance_count == wall.instance_count == 80

    def errors(window_calls: pd.DataFrame, window_inst: pd.DataFrame) -> pd.Series:
        check = check_curve(default_curve(), window_calls, window_inst, n_bins=4)
        return check.loc[check.quantity == "input_tokens_per_s", "rel_error"]

    own_errors = errors(own.calls, own.instances)
    wall_errors = errors(wall.calls, wall.instances)
    assert own_errors.abs().max() < 0.15
    # On wall-clock ages the tasks look slower than they are (stretched by waiting): the
    # default "over-predicts" them in every bin, and by far more than on the own clock.
    assert wall_errors.min() > 0
    assert wall_errors.abs().mean() > 2 * own_errors.abs().mean() + 0.1


def test_refit_compares_with_the_version_in_use_and_writes_the_next(
    sim_engine: Engine,  # noqa: F811
    tmp_path: Path,
) -> None:
    result = refit(sim_engine, "mini-swe-agent")
    assert result.current is not None and result.current.version == 0
    cmp = result.comparison
    young = cmp[(cmp.quantity == "input_tokens_per_s") & (cmp.bin_start_s < 240)]
    assert young["rel_error_new"].abs().max() < 0.10  # in-sample, where most tasks are alive
    assert set(result.worst_errors("new")) >= {"calls_per_s", "input_tokens_per_s"}
    assert set(result.comparison.columns) >= {"rel_error_new", "rel_error_current"}
    quality = result.fit_quality()
    assert quality["instances"] == 80 and quality["replaces_version"] == 0
    assert quality["window"]["unthrottled"] is True
    fig = plot_refit(result)
    labels = [(ax.get_xlabel(), ax.get_ylabel()) for ax in fig.axes]
    assert ("task age (min)", "share of tasks still running") in labels
    assert ("", "calls/s per task") in labels
    fig.savefig(tmp_path / "refit.png", dpi=50)
    assert png_size(tmp_path / "refit.png") == (550, 375)
    version = write_refit(sim_engine, result)
    stored = latest_curve(sim_engine, "mini-swe-agent")
    assert (stored.version, stored.curve) == (version, result.curve)
    assert stored.sample_count == result.window.call_count
    with pytest.raises(ConfigError, match="need at least 1000"):
        refit(sim_engine, "mini-swe-agent", min_instances=1000)


# ----------------------------------------------------------------------------- timeline


def test_timeline_reads_the_run_and_bins_its_calls(
    sim_engine: Engine,  # noqa: F811
    sim_ledger: tuple[str, str],  # noqa: F811
    sim_run: SimulatedRun,  # noqa: F811
) -> None:
    tl = load_timeline(sim_engine)  # newest run by default
    assert tl.run_id == sim_ledger[1]
    assert tl.start == START
    assert tl.duration_min == pytest.approx(sim_run.makespan_s / 60.0)
    assert tl.header_limits == {"requests": 400.0, "tokens": 200_000.0}
    # each instance's boot is the simulator's: its launch to its harness's first step
    simulated_boots = (sim_run.instances["started_s"] - sim_run.instances["launched_s"]).to_numpy()
    assert sorted(tl.instances["boot_s"]) == pytest.approx(sorted(simulated_boots), abs=1e-3)
    assert tl.instances["boot_s"].min() > 0
    rates = per_minute(tl)
    ok = sim_run.calls["status"] == 200
    assert rates["calls_per_s"].sum() * 60 == pytest.approx(ok.sum())
    assert rates["output_tokens_per_s"].sum() * 60 == pytest.approx(
        sim_run.calls.loc[ok, "output_tokens"].sum()
    )
    # one 429 column per limit type the calls name, each counting that type's 429s
    throttled = sim_run.calls.loc[~ok, "limit_type"].value_counts()
    kinds = sorted(c for c in rates.columns if c.startswith("429:"))
    assert kinds == sorted(f"429:{kind}" for kind in throttled.index)
    for kind, count in throttled.items():
        assert rates[f"429:{kind}"].sum() == count
    assert sum(rates[k].sum() for k in kinds) == (~ok).sum()
    assert tl.audit["action"].tolist() == ["run.launch", "provider.limit_change", "run.close"]
    assert tl.audit["t_min"].tolist()[1] == pytest.approx(10.0)
    with pytest.raises(NotFound, match="run nope does not exist"):
        load_timeline(sim_engine, "nope")


def test_timeline_figures_have_their_axes_and_save_as_non_empty_png(
    sim_engine: Engine,  # noqa: F811
    tmp_path: Path,
) -> None:
    tl = load_timeline(sim_engine)
    figures = timeline_figures(tl)
    fleet = figures["fleet"].axes[0]
    assert (fleet.get_xlabel(), fleet.get_ylabel()) == (TIME_LABEL, "tasks")
    fleet_legend = fleet.get_legend()
    assert fleet_legend is not None
    legend = [t.get_text() for t in fleet_legend.get_texts()]
    # one band label per constraint the planner reported
    bindings = {f"binding: {b}" for b in tl.decisions["binding"].astype(str)}
    assert {"live (running)", "booting", "ceiling"} <= set(legend)
    assert {t for t in legend if t.startswith("binding: ")} == bindings
    # operator actions: one marker per audit entry, labelled with its action
    assert {t.get_text() for t in fleet.texts} == {
        "run.launch",
        "provider.limit_change",
        "run.close",
    }
    assert [ax.get_ylabel() for ax in figures["rates"].axes] == ["calls/s", "tokens/s"]
    rates_legend = figures["rates"].axes[1].get_legend()
    assert rates_legend is not None
    rate_legend = [t.get_text() for t in rates_legend.get_texts()]
    assert "budget tokens/s" in rate_legend and "header tokens" in rate_legend
    assert figures["throttles"].axes[0].get_ylabel() == "429s per minute"
    assert [ax.get_xlabel() for ax in figures["instances"].axes] == [
        "duration (min)",
        "boot (s)",
        "cost (USD)",
    ]

    manifest = save_figures(figures, tmp_path, dpi=60)
    assert [m["name"] for m in manifest] == ["fleet", "rates", "throttles", "instances"]
    for item in manifest:
        path = tmp_path / item["file"]
        fig = figures[item["name"]]
        width, height = (round(x * 60) for x in fig.get_size_inches())
        assert png_size(path) == (item["width"], item["height"]) == (width, height)
        pixels = matplotlib.image.imread(path)
        assert pixels.shape[:2] == (height, width)
        assert float(pixels[..., :3].std()) > 0.05  # drawn on, not a blank canvas
    assert (tmp_path / "figures.json").is_file()
    with pytest.raises(ConfigError, match="not a PNG"):
        (tmp_path / "fake.png").write_bytes(b"GIF89a" + b"\0" * 40)
        png_size(tmp_path / "fake.png")
