"""``evalfleet keys revoke RUN_ID``: revoke a run's gateway and provider keys (idempotent)."""

from __future__ import annotations

from datetime import UTC, datetime

import click

from evalfleet.errors import EvalfleetError, NotFound
from evalfleet.settings import get_settings


@click.group(name="keys")
def keys_group() -> None:
    """A run's provider and gateway keys."""


@keys_group.command(name="revoke")
@click.argument("run_id")
def revoke(run_id: str) -> None:
    """Revoke both keys of RUN_ID: the gateway key in the ledger, the provider key at the
    provider (and its Prefect Secret block)."""
    from sqlalchemy import select
    from sqlalchemy.exc import SQLAlchemyError

    from gateway.factory import aliases_from, minter_for
    from gateway.keys import PrefectSecretKeyStore, revoke_run_keys
    from ledger.db import make_engine, session_factory
    from ledger.models import Run

    settings = get_settings()
    engine = make_engine(settings.ledger_url)
    try:
        sessions = session_factory(engine)
        try:
            with sessions() as session:
                alias_name = session.execute(select(Run.alias).where(Run.id == run_id)).scalar()
        except SQLAlchemyError as exc:
            raise EvalfleetError(
                f"cannot read the ledger ({type(exc).__name__}); is it migrated? "
                "(evalfleet db upgrade)"
            ) from None
        if alias_name is None:
            raise NotFound(f"run {run_id!r} does not exist")
        alias = aliases_from(settings).get(alias_name)
        revoked = revoke_run_keys(
            sessions,
            run_id,
            minter=minter_for(alias, settings),
            store=PrefectSecretKeyStore(),
            now=datetime.now(UTC),
        )
    finally:
        engine.dispose()
    click.echo(
        f"run {run_id}: {len(revoked)} key(s) revoked"
        if revoked
        else f"run {run_id}: no active key"
    )


def register(root: click.Group) -> None:
    root.add_command(keys_group)
