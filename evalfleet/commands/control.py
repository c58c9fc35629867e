"""Operator controls from the command line; each needs ``--reason`` and writes one audit row.

* ``evalfleet cap RUN N|none --reason R`` — a run's task cap.
* ``evalfleet override run RUN N|none --reason R`` / ``override alias ALIAS N|none ...`` — an
  operator ceiling (``0`` holds launches, ``none`` clears).
* ``evalfleet abort run RUN | alias ALIAS | all [--live finish|cancel] --reason R`` — queued work
  removed at once; live instances finish (run drains) or are cancelled (run aborted, keys
  revoked, their Prefect flow runs cancelled).
* ``evalfleet pacer show ALIAS [--json]``, ``pacer set ALIAS --calls-per-s X ... --reason R``,
  ``pacer rebase ALIAS --calls-per-s X ... --reason R``.

``--actor`` defaults to ``cli:<login name>``. Bad values exit 2 naming the field; nothing is
written then.
"""

from __future__ import annotations

import getpass
import json
from collections.abc import Callable
from typing import Any

import click

from tasks import controls

PACER_OPTIONS = (
    ("calls_per_s", "calls/s budget"),
    ("tokens_per_s", "counted input (or combined) tokens/s budget"),
    ("output_tokens_per_s", "output tokens/s budget"),
    ("inflight_tokens", "in-flight tokens budget"),
    ("burst_s", "burst seconds"),
    ("cooldown_s", "cooldown seconds after a 429"),
)
BUDGET_OPTIONS = PACER_OPTIONS[:4]


class CountOrNone(click.ParamType):  # type: ignore[type-arg]
    """A whole number, or ``none`` to clear."""

    name = "N|none"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if value is None or isinstance(value, int):
            return value
        if str(value).lower() == "none":
            return None
        try:
            return int(str(value))
        except ValueError:
            self.fail(f"{value!r} is not a whole number or 'none'", param, ctx)


def _default_actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def _audited(func: Callable[..., Any]) -> Callable[..., Any]:
    func = click.option("--actor", default=None, help="Who acts (default cli:<login name>).")(func)
    return click.option("--reason", required=True, help="Why (required; goes to the audit log).")(
        func
    )


def _show(change: Any) -> None:
    click.echo(f"{change.action} {change.target}: {change.old} -> {change.new}")


@click.command("cap")
@click.argument("run_id")
@click.argument("cap", type=CountOrNone())
@_audited
def cap_command(run_id: str, cap: int | None, reason: str, actor: str | None) -> None:
    """Set a run's task cap (most live instances), or clear it with 'none'."""
    _show(controls.cap_run(run_id, cap, actor=actor or _default_actor(), reason=reason))


@click.command("override")
@click.argument("scope", type=click.Choice(["run", "alias"]))
@click.argument("target")
@click.argument("value", type=CountOrNone())
@_audited
def override_command(
    scope: str, target: str, value: int | None, reason: str, actor: str | None
) -> None:
    """Set the operator ceiling of a run or an alias (0 holds launches; 'none' clears)."""
    _show(controls.override(scope, target, value, actor=actor or _default_actor(), reason=reason))


@click.command("abort")
@click.argument("scope", type=click.Choice(["run", "alias", "all"]))
@click.argument("target", required=False)
@click.option(
    "--live",
    type=click.Choice(["finish", "cancel"]),
    default="finish",
    show_default=True,
    help="Live instances: let them land (run drains) or cancel them (run aborted).",
)
@_audited
def abort_command(
    scope: str, target: str | None, live: str, reason: str, actor: str | None
) -> None:
    """Abort a run, every live run of an alias, or every live run."""
    outcome = controls.abort(
        scope, target, live=live, actor=actor or _default_actor(), reason=reason
    )
    for run in outcome.result.runs:
        click.echo(
            f"run {run.run_id}: {run.old_state} -> {run.new_state}; removed {run.removed_jobs} "
            f"queued job(s), aborted {run.aborted_instances} instance(s), {run.live_left} live left"
        )
    click.echo(
        f"{len(outcome.result.runs)} run(s) aborted; revoked {outcome.revoked_keys} key(s); "
        f"cancelled {outcome.cancelled_flow_runs} flow run(s)"
    )


@click.group("pacer")
def pacer_group() -> None:
    """Show or change an alias's pacer constants (audited)."""


@pacer_group.command("show")
@click.argument("alias")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def pacer_show(alias: str, as_json: bool) -> None:
    """The constants in force, the seed and the version of ALIAS's pacer."""
    shown = controls.pacer_show(alias)
    if as_json:
        click.echo(json.dumps(shown, indent=2))
        return
    for key, value in shown.items():
        click.echo(f"{key:20} {value}")


def _value_options(options: tuple[tuple[str, str], ...]) -> Callable[..., Any]:
    def decorate(func: Callable[..., Any]) -> Callable[..., Any]:
        for name, help_text in reversed(options):
            flag = "--" + name.replace("_", "-")
            func = click.option(flag, name, type=float, default=None, help=help_text)(func)
        return func

    return decorate


@pacer_group.command("set")
@click.argument("alias")
@_value_options(PACER_OPTIONS)
@_audited
def pacer_set(alias: str, reason: str, actor: str | None, **values: float | None) -> None:
    """Edit the given constants of ALIAS's pacer (the others keep their values)."""
    changes = {k: v for k, v in values.items() if v is not None}
    _show(controls.pacer_set(alias, changes, actor=actor or _default_actor(), reason=reason))


@pacer_group.command("rebase")
@click.argument("alias")
@_value_options(BUDGET_OPTIONS)
@_audited
def pacer_rebase(alias: str, reason: str, actor: str | None, **values: float | None) -> None:
    """Re-base ALIAS's seed and budgets (to the new seed) for the given budget classes."""
    seed = {k: v for k, v in values.items() if v is not None}
    _show(controls.pacer_rebase(alias, seed, actor=actor or _default_actor(), reason=reason))


def register(root: click.Group) -> None:
    for command in (cap_command, override_command, abort_command, pacer_group):
        root.add_command(command)
