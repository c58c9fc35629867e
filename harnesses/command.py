"""The ``command`` harness and evaluator: run an external program on one instance, read its JSON.

The program gets a minimal environment, never the parent's (so no evalfleet secret such as a
database URL leaks into it): ``PATH``, ``HOME`` (its private working folder), the options'
``env``, and the evalfleet variables below. The gateway key is ONLY in its environment
(``EVALFLEET_GATEWAY_KEY`` and ``OPENAI_API_KEY``), never on its command line.

    EVALFLEET_RUN_ID, EVALFLEET_INSTANCE_ID, EVALFLEET_RESULT_PATH
    EVALFLEET_GATEWAY_URL / OPENAI_BASE_URL (harness) ; EVALFLEET_PATCH_PATH (evaluator)
    EVALFLEET_TASK_STARTED_AT, EVALFLEET_TASK_TIMEOUT_S (harness): a program that sends them to
    the gateway as x-evalfleet-task-started-at / x-evalfleet-task-timeout-s gives the pacer its
    task's age and timeout, as the built-in harnesses do (an alias's pacer.urgent_share then puts
    its calls first near the timeout)

``argv`` items may use the placeholders ``{instance_id}``, ``{run_id}``, ``{result_path}``,
``{gateway_url}`` (harness) and ``{patch_path}`` (evaluator). The program writes its result JSON
to ``EVALFLEET_RESULT_PATH``: the harness ``{"patch": str | null, "calls"?: int, ...tokens}``,
the evaluator ``{"resolved": bool, "detail"?: str}``. A non-zero exit, a timeout, or a missing or
malformed result is ``HarnessFailed`` with the tail of the program's stderr. The harness's
program is killed at ``timeout_s`` or at the run's instance deadline, whichever comes first
(the latter is ``instance_timeout``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pydantic import Field, ValidationError

from evalfleet.errors import HarnessFailed
from harnesses.base import (
    AdapterOptions,
    Deadline,
    Evaluation,
    HarnessContext,
    HarnessResult,
    parse_options,
)

STDERR_TAIL_CHARS = 2_000
DEFAULT_PATH = os.pathsep.join([str(Path(sys.executable).parent), os.defpath])


class CommandOptions(AdapterOptions):
    argv: list[str] = Field(min_length=1, max_length=256)
    timeout_s: float = Field(default=3_600.0, gt=0.0, le=86_400.0)
    env: dict[str, str] = Field(default_factory=dict)
    path: str = Field(default=DEFAULT_PATH, min_length=1, max_length=8_192)


class _HarnessOutput(AdapterOptions):
    model_config = AdapterOptions.model_config | {"extra": "ignore"}
    patch: str | None
    calls: int = Field(default=0, ge=0)
    input_tokens: int = Field(default=0, ge=0)
    cached_input_tokens: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)


class _EvalOutput(AdapterOptions):
    model_config = AdapterOptions.model_config | {"extra": "ignore"}
    resolved: bool
    detail: str = Field(default="", max_length=10_000)


def _run(
    options: CommandOptions,
    placeholders: dict[str, str],
    env: dict[str, str],
    workdir: Path,
    deadline: Deadline | None = None,
) -> str:
    """Run the program; return its result file's text, or raise HarnessFailed. The program is
    killed after ``options.timeout_s``, or at ``deadline`` if that comes first
    (``instance_timeout``)."""
    try:
        argv = [item.format(**placeholders) for item in options.argv]
    except (KeyError, IndexError, ValueError) as exc:
        raise HarnessFailed("bad_argv", f"argv placeholder problem: {exc}") from None
    full_env = {**options.env, **env, "PATH": options.path, "HOME": str(workdir)}
    stderr_path = workdir / "stderr.txt"
    with stderr_path.open("wb") as stderr:
        try:
            proc = subprocess.Popen(
                argv,
                cwd=workdir,
                env=full_env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,
            )
        except OSError as exc:
            raise HarnessFailed("harness_not_started", f"{argv[0]}: {exc.strerror}") from None
        limit = options.timeout_s if deadline is None else deadline.bound(options.timeout_s)
        try:
            code = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            tail = f"stderr tail: {_tail(stderr_path)}"
            if deadline is not None and limit < options.timeout_s:
                raise deadline.expired(detail=f"killed; {tail}") from None
            raise HarnessFailed(
                "harness_timeout", f"no exit after {options.timeout_s:g}s; {tail}"
            ) from None
    if code != 0:
        raise HarnessFailed(
            "harness_exit", f"exit status {code}; stderr tail: {_tail(stderr_path)}"
        )
    result_path = Path(placeholders["result_path"])
    if not result_path.is_file():
        raise HarnessFailed(
            "harness_no_result",
            f"exited 0 without writing {result_path.name}; stderr tail: {_tail(stderr_path)}",
        )
    return result_path.read_text(errors="replace")


def _tail(path: Path) -> str:
    data = path.read_bytes()[-STDERR_TAIL_CHARS:]
    return data.decode(errors="replace").strip() or "(empty)"


def _parse(model: type[Any], text: str, what: str) -> Any:
    try:
        return model.model_validate(json.loads(text))
    except (json.JSONDecodeError, ValidationError) as exc:
        first = str(exc).splitlines()[0][:300]
        raise HarnessFailed("harness_bad_result", f"{what} is not valid: {first}") from None


class CommandHarness:
    """See the module docstring."""

    name = "command"

    def __init__(self, options: dict[str, object], source: str = "harness.options") -> None:
        self.options = parse_options(CommandOptions, dict(options), source)

    def run(self, ctx: HarnessContext) -> HarnessResult:
        with tempfile.TemporaryDirectory(prefix="evalfleet-harness-") as tmp:
            workdir = Path(tmp)
            result_path = str(workdir / "result.json")
            key = ctx.gateway_key.get_secret_value()
            env = {
                "EVALFLEET_RUN_ID": ctx.run_id,
                "EVALFLEET_INSTANCE_ID": ctx.instance_id,
                "EVALFLEET_RESULT_PATH": result_path,
                "EVALFLEET_GATEWAY_URL": ctx.gateway_url,
                "EVALFLEET_GATEWAY_KEY": key,
                "EVALFLEET_MODEL": ctx.alias,
                "OPENAI_BASE_URL": ctx.gateway_url.rstrip("/") + "/v1",
                "OPENAI_API_KEY": key,
            }
            if ctx.started_at is not None:
                env["EVALFLEET_TASK_STARTED_AT"] = f"{ctx.started_at:.3f}"
            if ctx.deadline is not None:
                env["EVALFLEET_TASK_TIMEOUT_S"] = f"{ctx.deadline.timeout_s:g}"
            placeholders = {
                "instance_id": ctx.instance_id,
                "run_id": ctx.run_id,
                "result_path": result_path,
                "gateway_url": ctx.gateway_url,
            }
            text = _run(self.options, placeholders, env, workdir, ctx.deadline)
        out: _HarnessOutput = _parse(_HarnessOutput, text, "the harness result JSON")
        return HarnessResult(
            patch=out.patch,
            calls=out.calls,
            input_tokens=out.input_tokens,
            cached_input_tokens=out.cached_input_tokens,
            output_tokens=out.output_tokens,
        )


class CommandEvaluator:
    """Grades a patch with an external program (e.g. the SWE-bench harness on one instance)."""

    name = "command"

    def __init__(self, options: dict[str, object], source: str = "evaluator.options") -> None:
        self.options = parse_options(CommandOptions, dict(options), source)

    def evaluate(self, run_id: str, instance_id: str, patch: str | None) -> Evaluation:
        with tempfile.TemporaryDirectory(prefix="evalfleet-eval-") as tmp:
            workdir = Path(tmp)
            result_path = str(workdir / "result.json")
            patch_path = workdir / "patch.diff"
            patch_path.write_text(patch or "")
            env = {
                "EVALFLEET_RUN_ID": run_id,
                "EVALFLEET_INSTANCE_ID": instance_id,
                "EVALFLEET_RESULT_PATH": result_path,
                "EVALFLEET_PATCH_PATH": str(patch_path),
            }
            placeholders = {
                "instance_id": instance_id,
                "run_id": run_id,
                "result_path": result_path,
                "patch_path": str(patch_path),
            }
            text = _run(self.options, placeholders, env, workdir)
        out: _EvalOutput = _parse(_EvalOutput, text, "the evaluator result JSON")
        return Evaluation(resolved=out.resolved, detail=out.detail)
