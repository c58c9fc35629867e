"""Harness and evaluator adapters against a fake OpenAI-compatible endpoint and real programs."""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr

from evalfleet.errors import ConfigError, HarnessFailed, InfrastructureFailure
from harnesses import make_evaluator, make_harness
from harnesses.base import INSTANCE_TIMEOUT, Deadline, HarnessContext
from sim.traces import load_calls

KEY = "gw-test-secret-123456"


class FakeProvider:
    """Answers chat completions, counting ~4 characters per token, like the simulated provider."""

    def __init__(self, fail_with: int | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[httpx.Headers] = []
        self.fail_with = fail_with

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        self.headers.append(request.headers)
        if self.fail_with is not None:
            return httpx.Response(self.fail_with, json={"error": {"message": "nope", "type": "x"}})
        chars = sum(len(m["content"]) for m in body["messages"])
        prompt = -(-chars // 4)
        out = min(body.get("max_tokens", 50), 40)
        return httpx.Response(
            200,
            json={
                "id": "c1",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "finish_reason": "stop",
                        "message": {"role": "assistant", "content": "x" * (out * 4)},
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": out,
                    "total_tokens": prompt + out,
                    "prompt_tokens_details": {"cached_tokens": prompt // 2},
                },
            },
        )


def ctx(provider: FakeProvider, instance: str = "django__django-1") -> HarnessContext:
    client = httpx.Client(transport=httpx.MockTransport(provider), base_url="http://gw")
    return HarnessContext(
        run_id="run-1",
        instance_id=instance,
        alias="sim-openai",
        gateway_url="http://gw",
        gateway_key=SecretStr(KEY),
        http_client=client,
    )


def test_simulated_harness_resends_a_growing_history_and_counts_usage() -> None:
    provider = FakeProvider()
    harness = make_harness("simulated", {"calls_median": 12, "think_s": 0.0, "token_scale": 0.1})
    result = harness.run(ctx(provider))
    planned = harness.planned_calls("run-1", "django__django-1")  # type: ignore[attr-defined]
    assert result.calls == planned == len(provider.requests)
    sizes = [sum(len(m["content"]) for m in r["messages"]) // 4 for r in provider.requests]
    assert all(b > a for a, b in itertools.pairwise(sizes)), sizes
    # growth per step ~ observation (45 tokens at scale 0.1) + the reply (40 tokens)
    steps = [b - a for a, b in itertools.pairwise(sizes)]
    assert all(80 <= s <= 90 for s in steps), steps
    prompts = [-(-sum(len(m["content"]) for m in r["messages"]) // 4) for r in provider.requests]
    assert result.input_tokens == sum(prompts)
    assert result.cached_input_tokens == sum(p // 2 for p in prompts)
    assert result.output_tokens == 40 * planned
    assert {r["model"] for r in provider.requests} == {"sim-openai"}
    assert all(h["authorization"] == f"Bearer {KEY}" for h in provider.headers)
    assert all(h["x-evalfleet-instance"] == "django__django-1" for h in provider.headers)
    assert result.patch and "django__django-1" in result.patch


def test_simulated_calls_are_fixed_per_instance_and_spread_like_the_traces() -> None:
    harness = make_harness("simulated", {})
    counts = [harness.planned_calls("r", f"i{n}") for n in range(400)]  # type: ignore[attr-defined]
    assert counts == [harness.planned_calls("r", f"i{n}") for n in range(400)]  # type: ignore[attr-defined]
    counts.sort()
    assert 30 <= counts[200] <= 42  # traces: median 36
    assert 55 <= counts[360] <= 80  # traces: p90 66


@pytest.mark.parametrize(
    ("status", "error", "label"),
    [
        (429, InfrastructureFailure, "rate_limited"),
        (503, InfrastructureFailure, "provider_unavailable"),
        (401, InfrastructureFailure, "gateway_refused_key"),
        (400, HarnessFailed, "provider_rejected_request"),
    ],
)
def test_call_failures_are_classified_and_never_show_the_key(
    status: int, error: type[HarnessFailed | InfrastructureFailure], label: str
) -> None:
    harness = make_harness("simulated", {"calls_median": 3, "think_s": 0.0})
    with pytest.raises(error) as info:
        harness.run(ctx(FakeProvider(fail_with=status)))
    assert isinstance(info.value, (HarnessFailed, InfrastructureFailure))
    assert info.value.error_class == label
    assert KEY not in str(info.value) and KEY not in repr(info.value)


def test_bad_options_name_the_field() -> None:
    with pytest.raises(ConfigError) as info:
        make_harness("simulated", {"think_s": -1})
    assert "harness.options" in str(info.value) and "think_s" in str(info.value)
    with pytest.raises(ConfigError, match="unknown harness 'nope'"):
        make_harness("nope", {})
    with pytest.raises(ConfigError, match="resolve_rate"):
        make_evaluator("simulated", {"resolve_rate": 2.0})


def test_trace_replay_sends_the_recorded_calls_of_one_instance() -> None:
    calls = load_calls()
    instance = calls.groupby("instance_id").size().idxmin()
    recorded = calls[calls.instance_id == instance].sort_values("step")
    provider = FakeProvider()
    harness = make_harness("trace-replay", {"time_scale": 0.0, "token_scale": 0.05})
    result = harness.run(ctx(provider, instance=instance))
    assert result.calls == len(recorded) == len(provider.requests)
    sent = [-(-sum(len(m["content"]) for m in r["messages"]) // 4) for r in provider.requests]
    expected = [max(1, round(t * 0.05)) for t in recorded.input_tokens]
    for got, want in zip(sent, expected, strict=True):
        assert got >= want - 2  # at least the recorded prompt (a longer history may exceed it)
    assert [r["max_tokens"] for r in provider.requests] == [
        max(1, round(t * 0.05)) for t in recorded.output_tokens
    ]
    # an id not in the trace maps to a trace instance deterministically
    other = make_harness("trace-replay", {})
    assert other.trace_instance("not-in-trace") == other.trace_instance("not-in-trace")  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="not in trace"):
        make_harness("trace-replay", {"instance": "nope__nope-1"})


def write_program(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "agent.py"
    path.write_text(textwrap.dedent(body))
    return [sys.executable, str(path), "{instance_id}"]


def test_command_harness_gets_the_key_in_its_environment_only(tmp_path: Path) -> None:
    out = tmp_path / "seen.json"
    argv = write_program(
        tmp_path,
        f"""
        import json, os, sys
        json.dump({{"argv": sys.argv, "env": dict(os.environ)}}, open({str(out)!r}, "w"))
        json.dump({{"patch": None}}, open(os.environ["EVALFLEET_RESULT_PATH"], "w"))
        """,
    )
    context = dataclasses.replace(
        ctx(FakeProvider()), started_at=1_700_000_000.25, deadline=Deadline.after(1800.0)
    )
    result = make_harness("command", {"argv": argv, "env": {"EXTRA": "1"}}).run(context)
    assert result.patch is None
    seen = json.loads(out.read_text())
    assert seen["env"]["EVALFLEET_TASK_STARTED_AT"] == "1700000000.250"
    assert seen["env"]["EVALFLEET_TASK_TIMEOUT_S"] == "1800"
    assert KEY not in " ".join(seen["argv"])
    assert seen["env"]["EVALFLEET_GATEWAY_KEY"] == KEY
    assert seen["env"]["EVALFLEET_INSTANCE_ID"] == "django__django-1"
    assert seen["env"]["EXTRA"] == "1"
    assert not [k for k in seen["env"] if k.startswith(("PREFECT_", "PYTEST"))]


def test_command_harness_failure_records_the_stderr_tail(tmp_path: Path) -> None:
    argv = write_program(
        tmp_path,
        """
        import sys
        print("x" * 5000, file=sys.stderr)
        print("Traceback: the agent broke", file=sys.stderr)
        sys.exit(3)
        """,
    )
    with pytest.raises(HarnessFailed) as info:
        make_harness("command", {"argv": argv}).run(ctx(FakeProvider()))
    assert info.value.error_class == "harness_exit"
    assert "exit status 3" in info.value.detail
    assert info.value.detail.rstrip().endswith("the agent broke")
    assert len(info.value.detail) < 2_200
    assert KEY not in info.value.detail


def test_command_harness_missing_result_and_timeout(tmp_path: Path) -> None:
    argv = write_program(tmp_path, "import sys; print('done, no file', file=sys.stderr)\n")
    with pytest.raises(HarnessFailed) as info:
        make_harness("command", {"argv": argv}).run(ctx(FakeProvider()))
    assert info.value.error_class == "harness_no_result"
    assert "done, no file" in info.value.detail
    slow = write_program(tmp_path, "import time; time.sleep(30)\n")
    with pytest.raises(HarnessFailed) as info:
        make_harness("command", {"argv": slow, "timeout_s": 0.5}).run(ctx(FakeProvider()))
    assert info.value.error_class == "harness_timeout"
    bad = write_program(
        tmp_path,
        "import os; open(os.environ['EVALFLEET_RESULT_PATH'], 'w').write('{\"patch\": 5}')\n",
    )
    with pytest.raises(HarnessFailed) as info:
        make_harness("command", {"argv": bad}).run(ctx(FakeProvider()))
    assert info.value.error_class == "harness_bad_result"


def test_simulated_evaluator_resolve_rate_is_deterministic() -> None:
    evaluator = make_evaluator("simulated", {"duration_s": 0.0, "resolve_rate": 0.25})
    verdicts = [evaluator.evaluate("r", f"i{n}", "diff").resolved for n in range(800)]
    assert verdicts == [evaluator.evaluate("r", f"i{n}", "diff").resolved for n in range(800)]
    assert 0.20 <= sum(verdicts) / 800 <= 0.30
    assert evaluator.evaluate("r", "i1", None).resolved is False


def test_command_evaluator_reads_the_patch_and_the_verdict(tmp_path: Path) -> None:
    path = tmp_path / "grade.py"
    path.write_text(
        "import json, os, sys\n"
        "patch = open(os.environ['EVALFLEET_PATCH_PATH']).read()\n"
        "json.dump({'resolved': 'good' in patch, 'detail': sys.argv[1]},"
        " open(os.environ['EVALFLEET_RESULT_PATH'], 'w'))\n"
    )
    evaluator = make_evaluator("command", {"argv": [sys.executable, str(path), "{instance_id}"]})
    assert evaluator.evaluate("r", "i1", "good patch").resolved is True
    verdict = evaluator.evaluate("r", "i2", "bad patch")
    assert verdict.resolved is False and verdict.detail == "i2"


class StepClock:
    """A monotonic clock that advances ``step_s`` on every read: a deadline ``n * step_s``
    away passes after a known number of reads, with no sleeping."""

    def __init__(self, step_s: float) -> None:
        self.now = 0.0
        self.step_s = step_s

    def __call__(self) -> float:
        self.now += self.step_s
        return self.now


def with_deadline(context: HarnessContext, deadline: Deadline) -> HarnessContext:
    return dataclasses.replace(context, deadline=deadline)


def test_simulated_harness_stops_at_the_instance_deadline() -> None:
    provider = FakeProvider()
    harness = make_harness("simulated", {"calls_median": 40, "calls_sigma": 0.0, "think_s": 0.0})
    # the deadline is read once when set, then before each call and after each (zero) pause
    deadline = Deadline.after(10.0, clock=StepClock(1.0))
    with pytest.raises(HarnessFailed) as info:
        harness.run(with_deadline(ctx(provider), deadline))
    assert info.value.error_class == INSTANCE_TIMEOUT
    assert "timeouts.instance_s = 10 s" in info.value.detail
    sent = len(provider.requests)
    assert 0 < sent < 40
    assert f"({sent} calls done)" in info.value.detail
    # the gateway is told the timeout, near which the pacer puts the task's calls first
    assert {h["x-evalfleet-task-timeout-s"] for h in provider.headers} == {"10"}
    # without a deadline the same instance makes every planned call
    provider = FakeProvider()
    assert harness.run(ctx(provider)).calls == 40 == len(provider.requests)
    assert not [h for h in provider.headers if "x-evalfleet-task-timeout-s" in h]


def test_trace_replay_pauses_end_at_the_deadline_not_after_the_recorded_gap() -> None:
    calls = load_calls()
    instance = calls.groupby("instance_id").size().idxmax()
    provider = FakeProvider()
    harness = make_harness("trace-replay", {"time_scale": 1.0, "token_scale": 0.01})
    started = time.monotonic()
    with pytest.raises(HarnessFailed) as info:
        harness.run(with_deadline(ctx(provider, instance=instance), Deadline.after(0.3)))
    waited = time.monotonic() - started
    assert info.value.error_class == INSTANCE_TIMEOUT
    # the recorded gaps add up to many minutes: the replay stopped at the deadline
    assert waited < 30.0
    assert len(provider.requests) < len(calls[calls.instance_id == instance])


def test_a_call_cut_short_by_the_deadline_is_a_timeout_not_a_gateway_failure() -> None:
    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("no answer", request=request)

    harness = make_harness("simulated", {"calls_median": 3, "think_s": 0.0})
    context = with_deadline(ctx(FakeProvider()), Deadline.after(0.0))
    client = httpx.Client(transport=httpx.MockTransport(slow), base_url="http://gw")
    with pytest.raises(HarnessFailed) as info:
        harness.run(dataclasses.replace(context, http_client=client))
    assert info.value.error_class == INSTANCE_TIMEOUT
    assert "(0 calls done)" in info.value.detail
    # the same timeout before the deadline is the gateway's failure: requeued, not scored
    context = with_deadline(ctx(FakeProvider()), Deadline.after(600.0))
    with pytest.raises(InfrastructureFailure) as failure:
        harness.run(dataclasses.replace(context, http_client=client))
    assert failure.value.error_class == "gateway_unreachable"


def test_command_harness_is_killed_at_the_instance_deadline(tmp_path: Path) -> None:
    marker = tmp_path / "still-running"
    slow = write_program(
        tmp_path,
        f"""
        import pathlib, sys, time
        print("agent step 1", file=sys.stderr, flush=True)
        time.sleep(1.5)
        pathlib.Path({str(marker)!r}).write_text("not killed")
        """,
    )
    harness = make_harness("command", {"argv": slow, "timeout_s": 60})
    with pytest.raises(HarnessFailed) as info:
        harness.run(with_deadline(ctx(FakeProvider()), Deadline.after(0.5)))
    assert info.value.error_class == INSTANCE_TIMEOUT
    assert "agent step 1" in info.value.detail and KEY not in info.value.detail
    time.sleep(2.0)  # past the program's own end, had it not been killed
    assert not marker.exists()
    # the harness's own timeout_s, when it comes first, keeps its own label
    with pytest.raises(HarnessFailed) as info:
        harness = make_harness("command", {"argv": slow, "timeout_s": 0.5})
        harness.run(with_deadline(ctx(FakeProvider()), Deadline.after(60.0)))
    assert info.value.error_class == "harness_timeout"
