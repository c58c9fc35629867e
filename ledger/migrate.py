"""Apply, revert and inspect the ledger's Alembic migrations, from code (no alembic.ini).

The Alembic config is built here with ``script_location`` = this package's ``migrations`` folder,
so the commands work from any working directory and from an installed copy. The connection is
opened with ``ledger.db.make_engine`` (same pragmas as the application) and passed to
``migrations/env.py``; the whole upgrade or downgrade runs in one transaction (both SQLite and
PostgreSQL have transactional DDL), so a failed migration leaves nothing half-applied.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

from evalfleet.errors import NotFound
from ledger.db import make_engine, readonly, sqlite_path

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config() -> Config:
    """An Alembic Config pointing at the ledger's migrations folder (no file, no URL)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def heads() -> list[str]:
    """The head revisions of the migration scripts (exactly one in a healthy tree)."""
    return list(ScriptDirectory.from_config(alembic_config()).get_heads())


def _engine(url: str, *, create_dir: bool) -> Engine:
    path = sqlite_path(url)
    if path is not None:
        if create_dir:
            path.parent.mkdir(parents=True, exist_ok=True)
        elif not path.exists():
            raise NotFound(f"no SQLite ledger at {path}")
    return make_engine(url, pool_size=1, max_overflow=0)


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate the ledger at ``url`` up to ``revision`` (creating a SQLite file's folder)."""
    engine = _engine(url, create_dir=True)
    try:
        with engine.begin() as connection:
            config = alembic_config()
            config.attributes["connection"] = connection
            command.upgrade(config, revision)
    finally:
        engine.dispose()


def downgrade(url: str, revision: str = "base") -> None:
    """Migrate the ledger at ``url`` down to ``revision`` ("base" removes every table).

    Raises NotFound for a SQLite file that does not exist (rather than creating one).
    """
    engine = _engine(url, create_dir=False)
    try:
        with engine.begin() as connection:
            config = alembic_config()
            config.attributes["connection"] = connection
            command.downgrade(config, revision)
    finally:
        engine.dispose()


def current(url: str) -> str | None:
    """The revision the ledger at ``url`` is at, or None for an empty (unmigrated) database.

    A SQLite file that does not exist is reported as None and is not created.
    """
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return None
    engine = _engine(url, create_dir=False)
    try:
        with readonly(engine).connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
