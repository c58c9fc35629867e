"""Flow ``dispatcher``: the admission loop that turns queued jobs into instance flow runs.

Each pass asks ``tasks.dispatch.admission`` how many jobs of each run may start (ceilings,
fair shares by priority, caps, overrides, pauses, free launcher slots), claims each run's own
allowance and hands each job reference to the launcher. A launch that fails to start sends its
job straight back to the queue (and the rest of the pass's claims with it). ``until_idle`` ends the loop once
no claimable run has a queued or live instance left (the demo and tests); otherwise it runs for ``max_passes``.
"""

from __future__ import annotations

import time

from prefect import flow

from evalfleet.settings import get_settings
from tasks import dispatch, instance, launchers


def make_launcher(kind: str) -> launchers.Launcher:
    settings = get_settings()
    if kind == "in-process":
        return launchers.InProcessLauncher(settings.in_process_threads)
    return launchers.WorkPoolLauncher(settings.instance_deployment, settings.static_cap)


def dispatch_pass(launcher: launchers.Launcher) -> int:
    """One admission pass; returns how many instances were started."""
    allowed = dispatch.admission(get_settings().static_cap, launcher.free_slots())
    leases = dispatch.claim_admitted(allowed)
    errors = launchers.launch_all(launcher, leases)
    failed = [(lease, exc) for lease, exc in zip(leases, errors, strict=True) if exc is not None]
    # nothing claimed in this pass stays leased without a flow run to hold it
    for lease, exc in failed:
        instance.requeue(lease, exc)
    if failed:
        raise failed[0][1]
    return len(leases)


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
            if until_idle and not any(
                x.claimable and (x.queued or x.live) for x in dispatch.run_loads()
            ):
                break
            time.sleep(settings.dispatch_tick_s)
    finally:
        chosen.wait()
    return started
