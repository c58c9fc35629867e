"""The ``simulated`` harness's shipped usage curve: generated offline from the harness's own
conversation model (``harnesses.simulated_calls``), reproducible by ``evalfleet curves
fit-simulated``, and the curve the planner uses for runs of that harness."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic import SecretStr

from evalfleet.cli import main
from evalfleet.commands.curves import fit_simulated_params
from evalfleet.commands.demo import HARNESS_OPTIONS, demo_profile
from gateway.provider_sim.completions import PrefixCache, Usage, openai_body, output_tokens
from harnesses.base import HarnessContext
from harnesses.simulated import SimulatedHarness
from harnesses.simulated_calls import OFFLINE_RUN_ID, offline_calls
from planner.curves import default_curve


class ModelProvider:
    """Answers like the simulated provider (its cache, output and body models), with no delay."""

    def __init__(self) -> None:
        self.profile = demo_profile()
        self.cache = PrefixCache(self.profile.cache_prefixes)
        self.usages: list[tuple[int, int, int]] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body: dict[str, Any] = json.loads(request.content)
        total, cached, prefixes = self.cache.lookup(body)
        self.cache.add(prefixes)
        out = output_tokens(self.profile, body, int(body["max_tokens"]))
        self.usages.append((total, cached, out))
        usage = Usage(input_total=total, input_cached=cached, output=out)
        return httpx.Response(200, json=openai_body(body["model"], usage, body["max_tokens"], 0))


def test_offline_calls_are_the_calls_the_harness_makes() -> None:
    options = {**HARNESS_OPTIONS, "think_s": 0.0}
    provider = ModelProvider()
    client = httpx.Client(transport=httpx.MockTransport(provider), base_url="http://gw")
    harness = SimulatedHarness(options)
    ids = [f"offline__instance-{i:05d}" for i in range(6)]
    for instance_id in ids:
        harness.run(
            HarnessContext(
                run_id=OFFLINE_RUN_ID,
                instance_id=instance_id,
                alias="sim-openai",
                gateway_url="http://gw",
                gateway_key=SecretStr("gw-key-123456"),
                http_client=client,
            )
        )
    calls, ends = offline_calls(options, demo_profile(), len(ids))
    assert list(calls.instance_id.unique()) == ids
    offline = list(
        calls[["input_tokens", "cached_input_tokens", "output_tokens"]].itertuples(
            index=False, name=None
        )
    )
    assert offline == provider.usages
    # the history is resent: every instance's input grows, and from its second call on
    # everything but the newest turn is a cache hit
    for _, group in calls.groupby("instance_id"):
        assert group.input_tokens.is_monotonic_increasing
        assert (group.cached_input_tokens.iloc[1:] > 0).all()
    assert (ends.wall_time_s >= 0).all()


def test_offline_ages_follow_think_time_and_the_providers_latency() -> None:
    profile = demo_profile()
    options = {**HARNESS_OPTIONS, "calls_sigma": 0.0}
    calls, ends = offline_calls(options, profile, 3, call_overhead_s=0.05)
    first = calls[calls.instance_id == calls.instance_id.iloc[0]]
    assert len(first) == HARNESS_OPTIONS["calls_median"]
    latency = profile.latency_s + profile.latency_per_output_token_s * first.output_tokens + 0.05
    gaps = np.diff(first.t_request_s.to_numpy())
    assert gaps == pytest.approx(latency.to_numpy()[:-1] + HARNESS_OPTIONS["think_s"])
    end = float(ends.wall_time_s.iloc[0])
    assert end == pytest.approx(first.t_request_s.iloc[-1] + latency.iloc[-1])


def test_the_shipped_curve_is_what_the_command_generates() -> None:
    shipped = default_curve("simulated").to_params()
    fresh, check = fit_simulated_params()
    assert shipped["fit"]["options"] == fresh["fit"]["options"]
    for part in ("rates", "survival"):
        for name, values in fresh[part].items():
            assert np.allclose(shipped[part][name], values, rtol=1e-9), (part, name)
    # the fit predicts held-out instances within a few percent per 5 s of age
    worst = fresh["fit"]["check"]["max_abs_rel_error"]
    assert worst["calls_per_s"] < 0.10
    assert worst["input_tokens_per_s"] < 0.10
    assert not check.empty


def test_the_simulated_curve_describes_the_demos_tasks_not_mini_swe_agents() -> None:
    curve = default_curve("simulated")
    reference = default_curve("mini-swe-agent")
    calls, ends = offline_calls(HARNESS_OPTIONS, demo_profile(), 300, run_id="elsewhere")
    assert curve.mean_duration_s() == pytest.approx(float(ends.wall_time_s.mean()), rel=0.1)
    per_task = float(calls.shape[0]) / 300
    ages = np.linspace(0.0, 300.0, 3001)
    expected_calls = float(np.trapezoid(curve.calls_per_s(ages) * curve.survival(ages), ages))
    assert expected_calls == pytest.approx(per_task, rel=0.1)
    assert reference.mean_duration_s() > 10 * curve.mean_duration_s()


def test_fit_simulated_writes_a_file_and_refuses_bad_options(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["curves", "fit-simulated", "--options", "[1]"]) == 2
    err = capsys.readouterr().err
    assert "--options" in err and "Traceback" not in err
    assert main(["curves", "fit-simulated", "--options", '{"think_s": -1}']) == 2
    assert "think_s" in capsys.readouterr().err
    args = ["curves", "fit-simulated", "--instances", "60", "--out", str(tmp_path), "--json"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["written"] is True
    written = json.loads((tmp_path / "simulated.json").read_text())
    assert written["harness"] == "simulated" and written["fit"]["train_instances"] == 60


def test_the_planner_uses_the_simulated_curve_for_simulated_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from evalfleet.settings import get_settings
    from ledger.curves import write_curve
    from tasks import ledger_io, plan_budgets

    monkeypatch.setenv("EVALFLEET_DATABASE_URL", f"sqlite:///{tmp_path / 'ledger.sqlite3'}")
    get_settings.cache_clear()
    ledger_io.engine.cache_clear()
    try:
        stored = plan_budgets.curve_for("simulated")
        assert (stored.harness, stored.version) == ("simulated", 0)
        assert stored.curve == default_curve("simulated")
        # a harness without a curve of its own still falls back to the default harness's
        assert plan_budgets.curve_for("command").harness == "mini-swe-agent"
        # a refit written to the ledger wins over the shipped file at the next read
        write_curve(
            ledger_io.engine(),
            default_curve("simulated"),
            sample_count=1,
            fit_quality={},
            source="test refit",
        )
        assert plan_budgets.curve_for("simulated").version == 1
    finally:
        ledger_io.engine().dispose()
        get_settings.cache_clear()
        ledger_io.engine.cache_clear()
        plan_budgets.curve_cache.cache_clear()
