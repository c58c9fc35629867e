"""The S3 launch path: a run config dropped into ``s3://bucket/prefix`` becomes a ``launch-run``.

Two halves, joined by a Prefect event ``s3.object.created`` whose resource id is
``s3.object.<bucket>.<key>`` and whose payload holds ``bucket``, ``key``, ``version_id``, ``etag``,
``size``, ``uri`` (pinned to the version) and ``idempotency_key``:

1. The trigger (``apply_s3_trigger``): a Prefect automation, one per bucket/prefix, with an
   ``EventTrigger`` on that event for ``s3.object.<bucket>.<prefix>*`` and a ``RunDeployment``
   action on the ``launch-run/launch`` deployment with ``config_uri = {{ event.payload.uri }}``.
   Created, or replaced only when its definition changed (idempotent). Templates that render
   ids must use ``| string`` (a bare ``{{ event.id }}`` fails silently: see PREFECT-NOTES.md);
   ``check_templates`` refuses such a template.
2. The bridge from S3 to Prefect events. On AWS: S3 → EventBridge → a rule whose target posts
   the event to Prefect (deployments/README.md, "Launching from S3"). Here and for OSS servers:
   ``S3Watcher`` (``evalfleet s3 watch``), a small poller that lists the prefix's latest object
   versions, validates each new one (size by HEAD first, then content) and emits the event for
   valid configs; a rejected object (too large, malformed, invalid) is recorded with its reason
   and announced as ``s3.object.rejected``, never launched, never a crash.

Durability: every object handled is a row of ``s3_drops`` keyed by its identity (bucket/key/
version, or ETag on an unversioned bucket). The event is sent *before* the row is written, so a
crash in between re-sends it after a restart rather than losing the drop; the launch is
idempotent on the same identity (``runs.idempotency_key``), so the same object is one run.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from evalfleet.config_sources import (
    S3ObjectInfo,
    bucket_problem,
    config_format,
    read_s3_config,
    source_unavailable,
)
from evalfleet.errors import ConfigError, ConfigSourceUnavailable, NotFound
from ledger.db import write_transaction
from ledger.models import S3Drop

EVENT_CREATED = "s3.object.created"
EVENT_REJECTED = "s3.object.rejected"
LAUNCH_DEPLOYMENT = "launch-run/launch"
LAUNCH_PARAMETERS = {"config_uri": "{{ event.payload.uri }}"}
MAX_PREFIX_CHARS = 512
MAX_REASON_CHARS = 2_000
_BARE_ID_TEMPLATE = re.compile(r"\{\{\s*[\w.]*\.id\s*\}\}")

Emitter = Callable[[Sequence[Any]], None]
"""Sends Prefect events (``prefect.events.Event``); raises if they could not be sent."""


def resource_id(bucket: str, key: str) -> str:
    """The Prefect resource id of an S3 object (matched by the trigger's prefix pattern)."""
    return f"s3.object.{bucket}.{key}"


def check_location(bucket: str, prefix: str) -> None:
    """ConfigError unless ``bucket`` is a valid bucket name and ``prefix`` a plain key prefix."""
    problems = []
    bad_bucket = bucket_problem(bucket)
    if bad_bucket is not None:
        problems.append(f"bucket: {bad_bucket}")
    if len(prefix) > MAX_PREFIX_CHARS:
        problems.append(f"prefix: must be at most {MAX_PREFIX_CHARS} characters")
    if not prefix.isprintable() or "*" in prefix:
        problems.append("prefix: must be printable and must not contain '*'")
    if problems:
        raise ConfigError("s3 location", problems)


def check_templates(parameters: dict[str, Any]) -> None:
    """Refuse a parameter template rendering a bare id (a UUID is not JSON: the action fails)."""
    bad = [
        name for name, v in parameters.items() if isinstance(v, str) and _BARE_ID_TEMPLATE.search(v)
    ]
    if bad:
        raise ConfigError(
            "automation parameters",
            [f"{name}: render ids as '{{{{ event.id | string }}}}'" for name in bad],
        )


# ---------------------------------------------------------------------------------------------
# The trigger: a Prefect automation


def automation_name(bucket: str, prefix: str) -> str:
    return f"evalfleet s3 launch {bucket}/{prefix}"


def launch_automation(bucket: str, prefix: str, deployment_id: Any) -> Any:
    """The automation (``AutomationCore``) launching a run for each config event under the prefix."""
    from prefect.events.actions import RunDeployment
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    check_location(bucket, prefix)
    check_templates(LAUNCH_PARAMETERS)
    return AutomationCore(
        name=automation_name(bucket, prefix),
        description=f"Launch a run for each run config dropped into s3://{bucket}/{prefix}",
        trigger=EventTrigger(
            expect={EVENT_CREATED},
            match={"prefect.resource.id": f"{resource_id(bucket, prefix)}*"},
            posture=Posture.Reactive,
            threshold=1,
        ),
        actions=[
            RunDeployment(
                source="selected", deployment_id=deployment_id, parameters=dict(LAUNCH_PARAMETERS)
            )
        ],
    )


def _shape(automation: Any) -> dict[str, Any]:
    return {
        "name": automation.name,
        "description": automation.description,
        "enabled": automation.enabled,
        "trigger": automation.trigger.model_dump(mode="json", exclude={"id"}),
        "actions": [a.model_dump(mode="json") for a in automation.actions],
    }


async def apply_s3_trigger(
    client: Any, bucket: str, prefix: str, deployment: str = LAUNCH_DEPLOYMENT
) -> str:
    """Create or update the bucket/prefix's launch automation; returns what was done."""
    from prefect.exceptions import ObjectNotFound

    check_location(bucket, prefix)
    try:
        dep = await client.read_deployment_by_name(deployment)
    except ObjectNotFound:
        raise NotFound(
            f"deployment {deployment!r} does not exist on Prefect: run `evalfleet deploy` first"
        ) from None
    wanted = launch_automation(bucket, prefix, dep.id)
    existing = await client.read_automations_by_name(wanted.name)
    if len(existing) == 1 and _shape(existing[0]) == _shape(wanted):
        return "unchanged"
    for automation in existing:
        await client.delete_automation(automation.id)
    await client.create_automation(wanted)
    return "updated" if existing else "created"


# ---------------------------------------------------------------------------------------------
# The bridge: events from a poller


def created_event(info: S3ObjectInfo) -> Any:
    """The ``s3.object.created`` event of a valid config object."""
    from prefect.events import Event

    return Event(
        event=EVENT_CREATED,
        resource={
            "prefect.resource.id": resource_id(info.bucket, info.key),
            "prefect.resource.name": info.key,
            "s3.bucket": info.bucket,
        },
        payload=_payload(info),
        id=uuid.uuid4(),
    )


def rejected_event(info: S3ObjectInfo, reason: str) -> Any:
    """The ``s3.object.rejected`` event of an object that will not be launched, with why."""
    from prefect.events import Event

    return Event(
        event=EVENT_REJECTED,
        resource={
            "prefect.resource.id": resource_id(info.bucket, info.key),
            "prefect.resource.name": info.key,
            "s3.bucket": info.bucket,
        },
        payload={**_payload(info), "reason": reason},
        id=uuid.uuid4(),
    )


def _payload(info: S3ObjectInfo) -> dict[str, Any]:
    return {
        "bucket": info.bucket,
        "key": info.key,
        "version_id": info.version_id,
        "etag": info.etag,
        "size": info.size,
        "uri": info.uri,
        "idempotency_key": info.identity,
    }


def prefect_emitter(timeout_s: float = 30.0) -> Emitter:
    """An emitter sending events to the Prefect API in PREFECT_API_URL, bounded by a timeout."""
    from prefect.settings import PREFECT_API_URL

    if not PREFECT_API_URL.value():
        raise ConfigError("prefect", ["PREFECT_API_URL is not set: no Prefect server to notify"])

    async def _send(events: Sequence[Any]) -> None:
        from prefect.events.clients import get_events_client

        async with get_events_client(reconnection_attempts=2) as client:
            for event in events:
                await client.emit(event)

    def emit(events: Sequence[Any]) -> None:
        if events:
            asyncio.run(asyncio.wait_for(_send(events), timeout_s))

    return emit


@dataclass
class WatchReport:
    """One poll: what was announced, refused (with why), left for the next poll, or known."""

    emitted: list[S3ObjectInfo] = field(default_factory=list)
    rejected: list[tuple[S3ObjectInfo, str]] = field(default_factory=list)
    deferred: list[tuple[S3ObjectInfo, str]] = field(default_factory=list)
    known: int = 0


class S3Watcher:
    """Polls one bucket/prefix and turns each new config object into an event (see module doc)."""

    def __init__(self, *, s3: Any, engine: Engine, bucket: str, prefix: str, emit: Emitter) -> None:
        check_location(bucket, prefix)
        self.s3 = s3
        self.engine = engine
        self.bucket = bucket
        self.prefix = prefix
        self.emit = emit

    def list_latest(self) -> list[S3ObjectInfo]:
        """The latest version of every object under the prefix (folders and deletions skipped)."""
        from botocore.exceptions import BotoCoreError, ClientError

        found: list[S3ObjectInfo] = []
        try:
            pages = self.s3.get_paginator("list_object_versions").paginate(
                Bucket=self.bucket, Prefix=self.prefix
            )
            for page in pages:
                for v in page.get("Versions", []):
                    if not v.get("IsLatest", False) or v["Key"].endswith("/"):
                        continue
                    version = v.get("VersionId")
                    found.append(
                        S3ObjectInfo(
                            bucket=self.bucket,
                            key=v["Key"],
                            version_id=None if version in (None, "null") else str(version),
                            etag=str(v.get("ETag", "")).strip('"'),
                            size=int(v.get("Size", 0)),
                        )
                    )
        except (BotoCoreError, ClientError) as exc:
            raise source_unavailable(
                f"s3://{self.bucket}/{self.prefix}", exc, self.s3, self.bucket, "the bucket"
            ) from None
        return found

    def _known(self, identities: list[str]) -> set[str]:
        known: set[str] = set()
        with self.engine.connect() as conn:
            for start in range(0, len(identities), 500):
                part = identities[start : start + 500]
                known.update(
                    conn.execute(select(S3Drop.identity).where(S3Drop.identity.in_(part))).scalars()
                )
        return known

    def _check(self, info: S3ObjectInfo) -> None:
        """Validate the object as the launch will (size first, then content); raises ConfigError."""
        config_format(info.key, info.uri)
        read_s3_config(self.s3, info)

    def poll_once(self) -> WatchReport:
        """List, validate what is new, emit, then record. Raises ConfigSourceUnavailable if the
        bucket cannot be listed and whatever the emitter raises (nothing is recorded then)."""
        report = WatchReport()
        objects = self.list_latest()
        known = self._known([o.identity for o in objects])
        report.known = sum(1 for o in objects if o.identity in known)
        events: list[tuple[S3ObjectInfo, Any, str | None]] = []
        for info in objects:
            if info.identity in known:
                continue
            try:
                self._check(info)
            except ConfigSourceUnavailable as exc:
                if exc.retryable:
                    report.deferred.append((info, _reason(exc)))
                    continue
                reason = _reason(exc)
                events.append((info, rejected_event(info, reason), reason))
                report.rejected.append((info, reason))
            except ConfigError as exc:
                reason = _reason(exc)
                events.append((info, rejected_event(info, reason), reason))
                report.rejected.append((info, reason))
            else:
                events.append((info, created_event(info), None))
                report.emitted.append(info)
        self.emit([event for _, event, _ in events])
        self._record(events)
        return report

    def _record(self, events: list[tuple[S3ObjectInfo, Any, str | None]]) -> None:
        for info, event, reason in events:
            row = {
                "identity": info.identity,
                "bucket": info.bucket,
                "key": info.key,
                "version_id": info.version_id,
                "etag": info.etag,
                "size": info.size,
                "state": "rejected" if reason is not None else "emitted",
                "reason": reason,
                "event_id": str(event.id),
            }
            try:
                with write_transaction(self.engine) as conn:
                    conn.execute(insert(S3Drop).values(**row))
            except IntegrityError:
                continue  # another watcher recorded it first: the same object, one record


def _reason(exc: ConfigError) -> str:
    return "; ".join(exc.problems)[:MAX_REASON_CHARS]


def recorded_drops(engine: Engine, bucket: str | None = None, limit: int = 50) -> list[S3Drop]:
    """The most recent ``s3_drops`` rows (of one bucket if given), newest first."""
    query = select(S3Drop).order_by(S3Drop.id.desc()).limit(limit)
    if bucket is not None:
        query = query.where(S3Drop.bucket == bucket)
    with Session(engine) as session:
        return list(session.scalars(query))


__all__ = [
    "EVENT_CREATED",
    "EVENT_REJECTED",
    "LAUNCH_DEPLOYMENT",
    "S3Watcher",
    "WatchReport",
    "apply_s3_trigger",
    "check_templates",
    "launch_automation",
    "prefect_emitter",
    "recorded_drops",
    "resource_id",
]
