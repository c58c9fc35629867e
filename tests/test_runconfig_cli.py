"""``evalfleet config validate``: exit 0 + one-line summary, or exit 2 + every problem, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from evalfleet.cli import main
from evalfleet.runconfig import RunConfig

CONFIGS = Path(__file__).parent / "data" / "configs"
GOOD = CONFIGS / "good"
BAD = CONFIGS / "bad"


def test_good_file_prints_one_summary_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["config", "validate", str(GOOD / "full.yaml")])
    out, err = capsys.readouterr()
    assert code == 0
    assert err == ""
    lines = out.splitlines()
    assert len(lines) == 1
    assert lines[0] == "ok: " + RunConfig.from_file(GOOD / "full.yaml").summary()
    for part in ("verified-sonnet-nightly", "simulated", "sim-anthropic", "3 instances", "$500.00"):
        assert part in lines[0]


def test_json_output_carries_the_resolved_config(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["config", "validate", "--json", str(GOOD / "file_form.yaml")])
    out, _ = capsys.readouterr()
    assert code == 0
    payload = json.loads(out)
    config = RunConfig.from_file(GOOD / "file_form.yaml")
    assert payload["content_hash"] == config.content_hash
    assert payload["config"]["instances"] == ["django__django-11099", "django__django-11133"]
    assert RunConfig.from_mapping(payload["config"], None) == config


def test_bad_file_prints_every_problem_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "name: nightly/1\n"
        "harness: {name: simulated, opts: {}}\n"
        "alias: sim-anthropic\n"
        "instances: [a__1, a__1]\n"
        "caps: {spend_usd: 0}\n"
        "max_attempts: '3'\n"
    )
    code = main(["config", "validate", str(path)])
    out, err = capsys.readouterr()
    assert code == 2
    assert out == ""
    assert "Traceback" not in err
    assert err.splitlines() == [
        f"error: {path}: 5 problems",
        "  name: must not contain a path separator ('/')",
        "  harness.opts: unknown key (not allowed here)",
        "  instances[1]: duplicate instance id 'a__1' (first at instances[0])",
        "  caps.spend_usd: must be greater than 0",
        "  max_attempts: must be a valid integer (got a string)",
    ]


@pytest.mark.parametrize(
    "name", ["malformed.yaml", "empty.json", "top_level_list.yaml", "missing_instances_file.yaml"]
)
def test_document_level_problems_exit_2(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["config", "validate", str(BAD / name)])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.startswith(f"error: {BAD / name}: 1 problem\n")
    assert "Traceback" not in err


def test_missing_config_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["config", "validate", str(tmp_path / "absent.yaml")])
    _, err = capsys.readouterr()
    assert code == 2
    assert err.splitlines() == [
        f"error: {tmp_path / 'absent.yaml'}: 1 problem",
        "  file does not exist",
    ]


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "validate"]) == 2
    _, err = capsys.readouterr()
    assert "Missing argument" in err


def _evalfleet_command() -> list[str]:
    script = Path(sys.executable).parent / "evalfleet"
    return [str(script)] if script.exists() else [sys.executable, "-m", "evalfleet.cli"]


def test_console_script_end_to_end() -> None:
    # One real process (the installed console script): exit code 2, problems, no traceback.
    # The success path is covered through main() above; each process start costs seconds.
    bad = subprocess.run(
        [*_evalfleet_command(), "config", "validate", str(BAD / "nan_spend.yaml")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.splitlines() == [
        f"error: {BAD / 'nan_spend.yaml'}: 1 problem",
        "  caps.spend_usd: must be a finite number (not NaN or infinity)",
    ]
    assert "Traceback" not in bad.stderr
