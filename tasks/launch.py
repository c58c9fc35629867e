"""Launch tasks: read and validate a run config, write the run, enqueue it, or fail it cleanly.

The launch unit (sequenced by ``flows.launch``): validate → ``runs`` row (``launching``) and
pending instance rows → mint both keys → enqueue one job per instance and go ``running``. The
run row comes first because the key rows reference it. A failure after the row exists revokes
whatever keys were minted and marks the run ``failed`` with the reason; nothing is left live.
A run an operator aborts while it is launching stays ``aborted``: enqueuing checks the state
in the same transaction (nothing is enqueued), the keys are revoked, and ``fail_run`` never
tries the illegal ``aborted → failed``.

Idempotency: a launch carries an idempotency key (given, or the S3 object's bucket/key/version,
or the config's content hash). A second launch with the same key returns the first run's id;
two racing launches are settled by the unique index on ``runs.idempotency_key``.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from sqlalchemy import select, update
from sqlalchemy.exc import IntegrityError

from evalfleet.config_sources import resolve_config
from evalfleet.errors import ConfigError
from evalfleet.runconfig import RunConfig
from evalfleet.settings import get_settings
from evalfleet.states import RunState, check_run_transition
from harnesses import make_evaluator, make_harness
from ledger.clock import db_now
from ledger.db import write_transaction
from ledger.forecasts import instance_sizes
from ledger.models import Run
from ledger.runs import NewRun, create_run, enqueue
from planner.launch_order import LaunchOrder, launch_ranks
from tasks.ledger_io import engine

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 2_000


def read_config(
    config: dict[str, Any] | None, config_uri: str | None
) -> tuple[RunConfig, str | None, str | None]:
    """(validated config, source, source idempotency key) from inline data or a URI."""
    if (config is None) == (config_uri is None):
        raise ConfigError("launch", ["give exactly one of `config` and `config_uri`"])
    if config is not None:
        cfg = RunConfig.from_mapping(config, None, source="config")
        source, source_key = None, None
    else:
        assert config_uri is not None
        resolved = resolve_config(config_uri)  # size/HEAD checks, version-pinned source and key
        cfg, source, source_key = resolved.config, resolved.source, resolved.idempotency_key
    # adapter options are checked now, before anything is written
    make_harness(cfg.harness.name, cfg.harness.options)
    if cfg.evaluator is not None:
        make_evaluator(cfg.evaluator.name, cfg.evaluator.options)
    return cfg, source, source_key


def existing_run(idempotency_key: str) -> str | None:
    """The id of the run already launched with this idempotency key, if any."""
    with engine().connect() as conn:
        return conn.execute(
            select(Run.id).where(Run.idempotency_key == idempotency_key)
        ).scalar_one_or_none()


def write_run(cfg: RunConfig, source: str | None, idempotency_key: str) -> tuple[str, bool]:
    """Write the run (``launching``) and its pending rows; (run id, created now?).

    A config without ``max_attempts`` gets the deployment's ``EVALFLEET_DEFAULT_MAX_ATTEMPTS``
    now: ``runs.max_attempts`` and the stored ``runs.config`` both hold the effective number.
    """
    if cfg.max_attempts is None:
        cfg = cfg.model_copy(update={"max_attempts": get_settings().default_max_attempts})
    run_id = str(uuid.uuid4())
    new = NewRun(
        run_id=run_id,
        name=cfg.name,
        harness=cfg.harness.name,
        alias=cfg.alias,
        instance_ids=cfg.instances,
        spend_cap_micro_usd=cfg.caps.spend_micro_usd,
        max_attempts=cfg.max_attempts,
        state=RunState.LAUNCHING,
        task_cap=cfg.caps.tasks,
        priority=cfg.priority,
        instance_timeout_s=cfg.timeouts.instance_s,
        config=cfg.to_json_dict(),
        config_source=source,
        idempotency_key=idempotency_key,
    )
    try:
        create_run(engine(), new, enqueue_now=False)
    except IntegrityError:
        winner = existing_run(idempotency_key)
        if winner is None:
            raise
        return winner, False
    return run_id, True


def enqueue_run(
    run_id: str, instance_ids: tuple[str, ...], launch_order: str = LaunchOrder.SHORT_LAST
) -> bool:
    """Enqueue one job per instance, in the run's launch order (``planner.launch_order``, on
    the instances' sizes in earlier runs of its harness, ``ledger.forecasts``), and go
    ``launching → running``, in one transaction.

    Returns False, enqueuing nothing, when the run is no longer ``launching`` (an operator
    aborted it meanwhile): the caller then revokes its keys and leaves it as it is.
    """
    order = LaunchOrder(launch_order)
    with write_transaction(engine()) as conn:
        current, harness = conn.execute(
            select(Run.state, Run.harness).where(Run.id == run_id).with_for_update()
        ).one()
        if current != RunState.LAUNCHING.value:
            return False
        sizes = (
            instance_sizes(conn, harness, instance_ids, excluding_run=run_id)
            if order is LaunchOrder.SHORT_LAST
            else {}
        )
        enqueue(conn, run_id, instance_ids, ranks=launch_ranks(instance_ids, sizes, order))
        log.info(
            "run %s: launch order %s; %d of %d instances ran before under harness %s",
            run_id,
            order.value,
            len(sizes),
            len(instance_ids),
            harness,
        )
        check_run_transition(current, RunState.RUNNING)
        conn.execute(
            update(Run)
            .where(Run.id == run_id)
            .values(state=RunState.RUNNING.value, updated_at=db_now(conn))
        )
    return True


_ENDED = frozenset({RunState.ABORTED.value, RunState.FAILED.value, RunState.CLOSED.value})


def fail_run(run_id: str, reason: str) -> RunState:
    """Mark a run ``failed`` with the reason (the caller has revoked its keys); returns the
    run's state after. A run that already ended (aborted by an operator while launching) is
    left as it is: its own ending stands and no illegal ``aborted → failed`` is attempted."""
    with write_transaction(engine()) as conn:
        current = conn.execute(
            select(Run.state).where(Run.id == run_id).with_for_update()
        ).scalar_one()
        if current in _ENDED:
            return RunState(current)
        check_run_transition(current, RunState.FAILED)
        now = db_now(conn)
        conn.execute(
            update(Run)
            .where(Run.id == run_id)
            .values(
                state=RunState.FAILED.value,
                updated_at=now,
                closed_at=now,
                failure_reason=reason[:MAX_REASON_CHARS],
            )
        )
    return RunState.FAILED
