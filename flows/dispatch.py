"""Flow ``dispatcher``: the admission loop that turns queued jobs into instance flow runs.

Each pass asks ``tasks.dispatch.admissible`` how many jobs may start (ceilings, shares, caps,
free launcher slots), claims that many and hands each job reference to the launcher. A launch
that fails to start sends its job straight back to the queue. ``until_idle`` ends the loop once
no claimable run has a queued or live instance left (the demo and tests); otherwise it runs for ``max_passes``.
"""

from __future__ import annotations

import time

from prefect import flow

from evalfleet.settings import get_settings
from tasks import dispatch, instance
from tasks.instance import JobRef


def make_launcher(kind: str) -> dispatch.Launcher:
    settings = get_settings()
    if kind == "in-process":
        return dispatch.InProcessLauncher(settings.in_process_threads)
    return dispatch.WorkPoolLauncher(settings.instance_deployment, settings.static_cap)


def dispatch_pass(launcher: dispatch.Launcher) -> int:
    """One admission pass; returns how many instances were started."""
    k = dispatch.admissible(get_settings().static_cap, launcher.free_slots())
    started = 0
    for lease in dispatch.claim_jobs(k):
        try:
            launcher.launch(JobRef.of(lease))
        except Exception as exc:
            instance.requeue(lease, exc)
            raise
        started += 1
    return started


@flow(name="dispatcher", persist_result=False)
def dispatcher_loop(
    launcher: str | None = None, until_idle: bool = False, max_passes: int | None = None
) -> int:
    """Admit jobs every ``dispatch_tick_s``; returns how many instances it started."""
    settings = get_settings()
    chosen = make_launcher(launcher or settings.launcher)
    started = 0
    passes = 0
    try:
        while max_passes is None or passes < max_passes:
            passes += 1
            started += dispatch_pass(chosen)
            if until_idle and not any(x.queued or x.live for x in dispatch.run_loads()):
                break
            time.sleep(settings.dispatch_tick_s)
    finally:
        chosen.wait()
    return started
