"""The launchers: how a claimed job becomes a running run-instance flow.

One interface (``launch(ref)``, ``free_slots()``, ``wait()``), two implementations chosen by
configuration: ``InProcessLauncher`` runs the run-instance flow in a bounded thread pool of this
process (the embedded default, light on a laptop); ``WorkPoolLauncher`` creates a flow run of the
run-instance deployment on a work pool (process locally, ECS in production) with the job
reference as its only parameter — a pass's jobs at once (``launch_many``: one client, a few
creations in flight, an idempotency key per lease; ``launch_all`` picks it). A job whose launch
failed is returned to the queue by the caller (``flows.dispatch``).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from evalfleet.errors import NotFound, StaleLease
from evalfleet.settings import get_settings
from ledger.queue import Lease
from tasks.instance import JobRef, requeue

log = logging.getLogger(__name__)
#: Flow-run creations the work-pool launcher keeps in flight at once.
LAUNCH_CONCURRENCY = 4


class Launcher(Protocol):
    def free_slots(self) -> int: ...

    def launch(self, ref: JobRef) -> None: ...

    def wait(self, timeout_s: float | None = None) -> None: ...


class InProcessLauncher:
    """Runs instance flows on at most ``threads`` daemon threads of this process.

    Daemon threads, and a bounded ``wait``: a flow stuck in a Prefect API call cannot keep the
    process alive; its lease expires and the reaper sends the job back to the queue.
    """

    def __init__(self, threads: int, run: Callable[[JobRef], Any] | None = None) -> None:
        if run is None:
            from flows.instance import run_instance

            run = run_instance
        self._run = run
        self._threads = threads
        self._lock = threading.Lock()
        self._inflight: set[threading.Thread] = set()

    def free_slots(self) -> int:
        with self._lock:
            return self._threads - len(self._inflight)

    def launch(self, ref: JobRef) -> None:
        # the caller's context (Prefect settings, the dispatcher flow run) goes with the thread
        context = contextvars.copy_context()
        thread = threading.Thread(
            target=context.run,
            args=(self._run_one, ref),
            name=f"instance-{ref.job_id}",
            daemon=True,
        )
        with self._lock:
            self._inflight.add(thread)
        thread.start()

    def _run_one(self, ref: JobRef) -> None:
        try:
            self._run(ref)
        except Exception as exc:
            # the flow requeues what fails inside it; this catches a flow that never started
            log.exception("instance flow of %s failed", ref.instance_id)
            with contextlib.suppress(StaleLease):
                requeue(ref.lease(), exc)
        finally:
            with self._lock:
                self._inflight.discard(threading.current_thread())

    def wait(self, timeout_s: float | None = None) -> None:
        """Wait for the running flows, at most ``timeout_s`` (default: the visibility timeout)."""
        limit = timeout_s if timeout_s is not None else get_settings().visibility_timeout_s
        deadline = time.monotonic() + limit
        while True:
            with self._lock:
                left = list(self._inflight)
            if not left or time.monotonic() >= deadline:
                break
            left[0].join(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
        if left:
            log.warning(
                "%d instance flow(s) still running at exit; their leases will expire", len(left)
            )


class WorkPoolLauncher:
    """Creates run-instance flow runs on a work pool (their only parameter: the job reference)."""

    def __init__(self, deployment: str, max_inflight: int) -> None:
        self._deployment = deployment
        self._max = max_inflight

    def free_slots(self) -> int:
        return self._max  # the pool's concurrency limit and the ledger's live count bound it

    def launch(self, ref: JobRef) -> None:
        from prefect.deployments import run_deployment

        run_deployment(
            self._deployment,
            parameters={"job": ref.model_dump()},
            timeout=0,
            as_subflow=False,
            flow_run_name=ref.flow_run_name,
            tags=["evalfleet", f"run:{ref.run_id}"],
        )

    def wait(self, timeout_s: float | None = None) -> None:
        return None

    def launch_many(self, refs: Sequence[JobRef]) -> list[Exception | None]:
        """Create the flow runs of ``refs`` concurrently on one client; per ref its error or None.

        The same API call ``run_deployment(timeout=0)`` makes, without its per-call client and
        deployment lookup (which cap it at a few launches/s on a busy machine): the deployment
        id is resolved once, ``LAUNCH_CONCURRENCY`` creations are in flight at a time, and each
        carries an idempotency key of its lease so a retried creation cannot start it twice.
        """
        from prefect.utilities.asyncutils import run_coro_as_sync

        results = run_coro_as_sync(self._create_flow_runs(list(refs)))
        assert results is not None
        return results

    async def _create_flow_runs(self, refs: list[JobRef]) -> list[Exception | None]:
        import asyncio

        from prefect import get_client

        gate = asyncio.Semaphore(LAUNCH_CONCURRENCY)
        async with get_client() as client:
            if getattr(self, "_deployment_id", None) is None:
                self._deployment_id = await _deployment_id(client, self._deployment)

            async def create(ref: JobRef) -> None:
                async with gate:
                    await client.create_flow_run_from_deployment(
                        self._deployment_id,
                        parameters={"job": ref.model_dump()},
                        name=ref.flow_run_name,
                        tags=["evalfleet", f"run:{ref.run_id}"],
                        idempotency_key=f"evalfleet-job-{ref.job_id}-{ref.token}",
                    )

            done = await asyncio.gather(*(create(r) for r in refs), return_exceptions=True)
        for r in done:
            if isinstance(r, BaseException) and not isinstance(r, Exception):
                raise r  # cancelled or interrupted: not a launch failure
        return [r if isinstance(r, Exception) else None for r in done]


async def _deployment_id(client: Any, name: str) -> Any:
    from prefect.exceptions import ObjectNotFound

    try:
        return (await client.read_deployment_by_name(name)).id
    except ObjectNotFound:
        raise NotFound(
            f"deployment {name} does not exist on the Prefect API "
            "(EVALFLEET_INSTANCE_DEPLOYMENT; `evalfleet deploy` creates it)"
        ) from None


@runtime_checkable
class BatchLauncher(Launcher, Protocol):
    """A launcher that starts many jobs in one call (``launch_many``: per job its error)."""

    def launch_many(self, refs: Sequence[JobRef]) -> list[Exception | None]: ...


def launch_all(launcher: Launcher, leases: Sequence[Lease]) -> list[Exception | None]:
    """Launch every claimed job; per lease the error that kept it from starting, or None.

    A batch launcher creates them concurrently; otherwise one ``launch`` after the other
    (stopping at the first failure: the rest are reported with that error, unlaunched).
    """
    refs = [JobRef.of(lease) for lease in leases]
    if not refs:
        return []
    if isinstance(launcher, BatchLauncher):
        try:
            return launcher.launch_many(refs)
        except Exception as exc:  # noqa: BLE001 - e.g. no such deployment: none was launched
            return [exc] * len(refs)
    errors: list[Exception | None] = []
    for index, ref in enumerate(refs):
        try:
            launcher.launch(ref)
        except Exception as exc:  # noqa: BLE001 - returned: the caller requeues and raises it
            return errors + [exc] * (len(refs) - index)
        errors.append(None)
    return errors
