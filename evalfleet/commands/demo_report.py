"""The demo's end report, from the ledger: a summary table and a timeline PNG.

Timeline panels (shared time axis, seconds since the run started): live fleet (instances
between first claim and terminal row) with the planner's ceiling; calls/s with the pacer's
budget (as each planner decision set it: the seed until the provider's headers cap it) and the
provider's limit; input tokens/s with the token budget; 429s per bucket.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from sqlalchemy import select

from evalfleet.commands.run import run_summary
from ledger.models import InstanceResult, LlmCall, PlannerDecision, Run
from tasks.ledger_io import engine

BUCKET_S = 5.0


def summary_table(run_id: str) -> str:
    """A plain-text table of the run's outcome."""
    s = run_summary(run_id)
    with engine().connect() as conn:
        rows = conn.execute(
            select(InstanceResult.started_at, InstanceResult.finished_at).where(
                InstanceResult.run_id == run_id
            )
        ).all()
    starts = [r[0] for r in rows if r[0] is not None]
    ends = [r[1] for r in rows if r[1] is not None]
    wall = (max(ends) - min(starts)).total_seconds() if starts and ends else 0.0
    lines = [
        ("run", s["run"]),
        ("state", s["state"]),
        *((f"instances {k}", str(v)) for k, v in sorted(s["instances"].items())),
        ("LLM calls", f"{s['calls']:,}"),
        ("input tokens", f"{s['input_tokens']:,}"),
        ("output tokens", f"{s['output_tokens']:,}"),
        ("cost", f"${s['cost_usd']:.4f}"),
        ("429s (retried by the gateway)", str(s["rate_limited"])),
        ("last ceiling (binding)", f"{s['ceiling']} ({s['binding']})"),
        ("wall time, first claim to last landing", f"{wall:.0f} s"),
    ]
    width = max(len(k) for k, _ in lines)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in lines)


def timeline_png(
    run_id: str,
    path: Path,
    calls_budget: float,
    provider_calls_per_s: float,
    tokens_budget: float,
) -> Path:
    """Draw the run's timeline to ``path``; returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with engine().connect() as conn:
        alias = conn.execute(select(Run.alias).where(Run.id == run_id)).scalar_one()
        inst = pd.DataFrame(
            conn.execute(
                select(InstanceResult.started_at, InstanceResult.finished_at).where(
                    InstanceResult.run_id == run_id
                )
            ).all(),
            columns=["start", "end"],
        )
        calls = pd.DataFrame(
            conn.execute(
                select(LlmCall.requested_at, LlmCall.status, LlmCall.input_tokens).where(
                    LlmCall.run_id == run_id
                )
            ).all(),
            columns=["at", "status", "input_tokens"],
        )
        decisions = pd.DataFrame(
            conn.execute(
                select(PlannerDecision.tick_at, PlannerDecision.ceiling, PlannerDecision.budgets)
                .where(PlannerDecision.alias == alias)
                .order_by(PlannerDecision.id)
            ).all(),
            columns=["at", "ceiling", "budgets"],
        )
    t0 = pd.to_datetime(inst["start"].min(), utc=True)

    def secs(col: pd.Series) -> pd.Series:
        return (pd.to_datetime(col, utc=True) - t0).dt.total_seconds()

    end_s = float(secs(inst["end"]).max()) if inst["end"].notna().any() else 0.0
    grid = [i * BUCKET_S for i in range(int(end_s // BUCKET_S) + 2)]
    starts, ends = secs(inst["start"]), secs(inst["end"]).fillna(end_s)
    live = [int(((starts <= t) & (ends > t)).sum()) for t in grid]
    fig, axes = plt.subplots(4, 1, figsize=(10, 10), sharex=True)
    axes[0].step(grid, live, where="post", label="live fleet")
    if not decisions.empty:
        axes[0].step(secs(decisions["at"]), decisions["ceiling"], where="post", label="ceiling")
    axes[0].set_ylabel("tasks")
    axes[0].legend(loc="upper right")
    ok = calls[calls["status"] == 200]
    buckets = (secs(ok["at"]) // BUCKET_S) * BUCKET_S if not ok.empty else pd.Series(dtype=float)
    rate = ok.groupby(buckets).size() / BUCKET_S if not ok.empty else pd.Series(dtype=float)
    axes[1].plot(rate.index, rate.values, label="calls/s")
    _budget_line(axes[1], decisions, secs, "calls_per_s", calls_budget)
    axes[1].axhline(provider_calls_per_s, color="tab:red", linestyle=":", label="provider limit")
    axes[1].set_ylabel("calls/s")
    axes[1].legend(loc="upper right")
    tokens = ok.groupby(buckets)["input_tokens"].sum() / BUCKET_S if not ok.empty else rate
    axes[2].plot(tokens.index, tokens.values, color="tab:green", label="input tokens/s")
    _budget_line(axes[2], decisions, secs, "tokens_per_s", tokens_budget, "token budget")
    axes[2].set_ylabel("tokens/s")
    axes[2].legend(loc="upper right")
    limited = calls[calls["status"] == 429]
    if not limited.empty:
        hits = limited.groupby((secs(limited["at"]) // BUCKET_S) * BUCKET_S).size()
        axes[3].bar(hits.index, hits.values, width=BUCKET_S * 0.8, color="tab:red")
    axes[3].set_ylabel("429s / bucket")
    axes[3].set_xlabel("seconds since the first claim")
    fig.suptitle(f"run {run_id} on {alias}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _budget_line(
    ax: Any,
    decisions: pd.DataFrame,
    secs: Callable[[pd.Series], pd.Series],
    name: str,
    seed: float,
    label: str = "pacer budget",
) -> None:
    """The budget each planner decision used (a step line), or the seed before any decision."""
    values = [
        b.get(name) if isinstance(b, dict) else None for b in decisions.get("budgets", pd.Series())
    ]
    if decisions.empty or all(v is None for v in values):
        ax.axhline(seed, color="tab:orange", linestyle="--", label=label)
        return
    ax.step(
        secs(decisions["at"]), values, where="post", color="tab:orange", linestyle="--", label=label
    )
