"""Harness usage curves in the ledger: versioned ``harness_curves`` rows, the refit's output,
and what the planner loop reads at every tick.

Writing (``write_curve``): a new version per harness (1, 2, ...), with the sample count and fit
quality. Concurrent writers are serialised per harness, so ``max(version) + 1`` is computed by one
writer at a time: on PostgreSQL by a transaction-scoped advisory lock on the harness (READ
COMMITTED alone lets every writer read the same maximum, and with N writers the last one would
lose N-1 unique-constraint races in a row), on SQLite by ``BEGIN IMMEDIATE``'s writer lock. The
unique (harness, version) constraint stays the backstop; a writer that still meets it retries.
Reading: ``latest_curve`` (newest version, else the shipped default as version 0),
``list_versions``, and ``CurveCache`` for the planner loop: one ``max(version)`` query per tick,
the params parsed again only when a newer version has landed.

The refit's input (the ``llm_calls`` of a time window as the fit's tables) is
``ledger.curve_window``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, func, insert, select, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from evalfleet.errors import ConfigError, NotFound
from ledger.clock import as_utc
from ledger.db import is_postgresql, readonly, write_transaction
from ledger.models import HarnessCurve as HarnessCurveRow
from planner.curves import HarnessCurve, default_curve

MAX_HARNESS_LEN = 64
MAX_SOURCE_LEN = 256
_WRITE_ATTEMPTS = 5
#: First key of the advisory locks serialising curve writers (the second is the harness's hash):
#: a namespace of its own, so no other advisory lock of the ledger can collide with it.
CURVE_LOCK_CLASS = 0x6376  # "cv"


@dataclass(frozen=True)
class StoredCurve:
    """A curve and where it came from: ``version`` 0 is the shipped default (not in the ledger)."""

    harness: str
    version: int
    curve: HarnessCurve
    sample_count: int
    fit_quality: Mapping[str, Any]
    source: str
    created_at: datetime | None


@dataclass(frozen=True)
class CurveVersion:
    """One row of ``list_versions`` (without the parameters)."""

    harness: str
    version: int
    sample_count: int
    source: str
    created_at: datetime
    fit_quality: Mapping[str, Any]


def check_harness(harness: str) -> None:
    """A harness name the ledger stores: 1-``MAX_HARNESS_LEN`` printable characters."""
    if not harness or len(harness) > MAX_HARNESS_LEN or not harness.isprintable():
        raise ConfigError(
            "--harness", [f"must be 1-{MAX_HARNESS_LEN} printable characters, got {harness!r}"]
        )


def write_curve(
    engine: Engine,
    curve: HarnessCurve,
    *,
    sample_count: int,
    fit_quality: Mapping[str, Any],
    source: str,
) -> int:
    """Store ``curve`` as the next version of its harness; returns the version number.

    ``fit_quality`` must be JSON-able (figures of the fit and its check); ``source`` says where
    the calls came from (e.g. ``ledger window 2026-...``). Concurrent writers get distinct
    versions: writers of one harness take turns (see the module docstring).
    """
    check_harness(curve.harness)
    problems = []
    if sample_count < 0:
        problems.append(f"sample_count: must be >= 0, got {sample_count}")
    if not source or len(source) > MAX_SOURCE_LEN:
        problems.append(f"source: must be 1-{MAX_SOURCE_LEN} characters")
    if problems:
        raise ConfigError("harness curve", problems)
    params = curve.to_params()
    for attempt in range(_WRITE_ATTEMPTS):
        try:
            with write_transaction(engine) as conn:
                _lock_harness(conn, curve.harness)
                current = conn.execute(
                    select(func.max(HarnessCurveRow.version)).where(
                        HarnessCurveRow.harness == curve.harness
                    )
                ).scalar_one()
                version = int(current or 0) + 1
                conn.execute(
                    insert(HarnessCurveRow).values(
                        harness=curve.harness,
                        version=version,
                        params=params,
                        sample_count=sample_count,
                        fit_quality=dict(fit_quality),
                        source=source,
                    )
                )
            return version
        except IntegrityError:
            if attempt == _WRITE_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")  # pragma: no cover


def _lock_harness(conn: Connection, harness: str) -> None:
    """Serialise the curve writers of ``harness`` until the transaction ends (PostgreSQL; on
    SQLite the transaction already holds the database's single writer lock)."""
    if is_postgresql(conn):
        conn.execute(
            text("SELECT pg_advisory_xact_lock(:lock_class, hashtext(:harness))"),
            {"lock_class": CURVE_LOCK_CLASS, "harness": harness},
        )


def _stored(row: HarnessCurveRow) -> StoredCurve:
    curve = HarnessCurve.from_params(
        row.params, source=f"harness_curves {row.harness!r} version {row.version}"
    )
    return StoredCurve(
        harness=row.harness,
        version=row.version,
        curve=curve,
        sample_count=row.sample_count,
        fit_quality=dict(row.fit_quality),
        source=row.source,
        created_at=as_utc(row.created_at),
    )


def _shipped(harness: str) -> StoredCurve:
    curve = default_curve(harness)
    return StoredCurve(
        harness=harness,
        version=0,
        curve=curve,
        sample_count=int(curve.fit_summary().get("train_calls", 0)),
        fit_quality=dict(curve.fit_summary()),
        source="shipped default (planner/default_curves)",
        created_at=None,
    )


def read_version(engine: Engine, harness: str, version: int) -> StoredCurve:
    """One stored version (0: the shipped default); NotFound if there is no such version."""
    check_harness(harness)
    if version == 0:
        return _shipped(harness)
    with Session(readonly(engine)) as session:
        row = session.scalars(
            select(HarnessCurveRow).where(
                HarnessCurveRow.harness == harness, HarnessCurveRow.version == version
            )
        ).one_or_none()
        if row is None:
            raise NotFound(f"harness {harness!r} has no curve version {version}")
        return _stored(row)


def latest_version(engine: Engine, harness: str) -> int:
    """The newest stored version number of ``harness`` (0 when none is stored)."""
    check_harness(harness)
    with readonly(engine).connect() as conn:
        value = conn.execute(
            select(func.max(HarnessCurveRow.version)).where(HarnessCurveRow.harness == harness)
        ).scalar_one()
    return int(value or 0)


def latest_curve(engine: Engine, harness: str) -> StoredCurve:
    """The curve the planner should use for ``harness`` now: its newest stored version, else
    the shipped default (version 0). NotFound when neither exists."""
    version = latest_version(engine, harness)
    if version == 0:
        return _shipped(harness)
    return read_version(engine, harness, version)


def list_versions(engine: Engine, harness: str | None = None) -> list[CurveVersion]:
    """Stored versions (all harnesses, or one), by harness then version."""
    if harness is not None:
        check_harness(harness)
    query = select(
        HarnessCurveRow.harness,
        HarnessCurveRow.version,
        HarnessCurveRow.sample_count,
        HarnessCurveRow.source,
        HarnessCurveRow.created_at,
        HarnessCurveRow.fit_quality,
    ).order_by(HarnessCurveRow.harness, HarnessCurveRow.version)
    if harness is not None:
        query = query.where(HarnessCurveRow.harness == harness)
    with readonly(engine).connect() as conn:
        rows = conn.execute(query).all()
    return [
        CurveVersion(
            harness=h,
            version=v,
            sample_count=n,
            source=s,
            created_at=as_utc(c),
            fit_quality=dict(q),
        )
        for h, v, n, s, c, q in rows
    ]


class CurveCache:
    """Per-harness latest curve for a loop: call ``get`` every tick.

    Each ``get`` runs one ``max(version)`` query; the stored parameters are read and parsed
    again only when that number changed, so a version written between two ticks is in use at
    the next one. Thread-safe.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._curves: dict[str, StoredCurve] = {}
        self._lock = threading.Lock()

    def get(self, harness: str) -> StoredCurve:
        version = latest_version(self._engine, harness)
        with self._lock:
            cached = self._curves.get(harness)
        if cached is not None and cached.version == version:
            return cached
        stored = _shipped(harness) if version == 0 else read_version(self._engine, harness, version)
        with self._lock:
            self._curves[harness] = stored
        return stored
