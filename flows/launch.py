"""Flow ``launch-run``: validate a run config, write the run, mint its keys, enqueue its jobs.

Parameters: an inline run config or a config URI (file path or ``s3://``), and an optional
idempotency key (default: the S3 object's bucket/key/version, else the config's content hash).
A launch that fails after the run row exists revokes the run's keys and marks it ``failed``
with the reason before re-raising (a run an operator aborted meanwhile stays ``aborted``); a bad
config fails before anything is written.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from tasks import keys, launch


@flow(name="launch-run", persist_result=False)
def launch_run(
    config: dict[str, Any] | None = None,
    config_uri: str | None = None,
    idempotency_key: str | None = None,
) -> str:
    """Launch a run; returns its id (the existing run's id for a repeated idempotency key)."""
    cfg, source, source_key = launch.read_config(config, config_uri)
    key = idempotency_key or source_key or cfg.content_hash
    existing = launch.existing_run(key)
    if existing is not None:
        return existing
    run_id, created = launch.write_run(cfg, source, key)
    if not created:
        return run_id
    try:
        keys.mint_keys(run_id, cfg.alias, cfg.caps.spend_micro_usd)
        enqueued = launch.enqueue_run(run_id, cfg.instances, cfg.launch_order)
    except Exception as exc:
        keys.revoke_keys(run_id)
        launch.fail_run(run_id, f"launch failed: {type(exc).__name__}: {exc}")
        raise
    if not enqueued:  # aborted by an operator while launching: it stays aborted, keys revoked
        keys.revoke_keys(run_id)
    return run_id
