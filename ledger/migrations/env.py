"""Alembic environment of the ledger, driven from code by ``ledger.migrate`` (no alembic.ini).

``ledger.migrate`` opens the connection (with the ledger's engine settings) and hands it over in
``config.attributes["connection"]``; this file only runs the migrations on it. Offline (SQL
script) mode is not supported: migrations run against a live database.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from ledger.models import Base

config = context.config


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        compare_type=True,
        # SQLite cannot ALTER most things in place; batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise RuntimeError("ledger migrations run online only (use `evalfleet db upgrade`)")

_connection = config.attributes.get("connection")
if _connection is None:
    raise RuntimeError("ledger.migrate passes the connection in config.attributes['connection']")
_run(_connection)
