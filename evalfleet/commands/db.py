"""``evalfleet db``: apply, revert and inspect the ledger's migrations.

``db upgrade [--url URL] [--to REV]``, ``db downgrade [--url URL] [--to REV]`` (default: base,
i.e. remove every table) and ``db current [--url URL]``. The URL defaults to the settings'
ledger URL (a SQLite file under the data folder, whose folder is created). URLs are never
echoed with their password.
"""

from __future__ import annotations

from collections.abc import Callable

import click
from alembic.util import CommandError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from evalfleet.errors import EvalfleetError
from evalfleet.settings import get_settings


class DatabaseUnavailable(EvalfleetError):
    """The ledger database could not be reached or refused the migration."""


def _url(url: str | None) -> str:
    return url if url is not None else get_settings().ledger_url


def _shown(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def _run(action: str, url: str, func: Callable[[], object]) -> None:
    try:
        func()
    except CommandError as exc:  # e.g. an unknown revision
        raise DatabaseUnavailable(f"{action} of {_shown(url)} refused: {exc}") from None
    except SQLAlchemyError as exc:
        # The driver's first line says what failed (connection refused, bad password, ...).
        cause = getattr(exc, "orig", None) or exc
        first = (str(cause).strip().splitlines() or [type(cause).__name__])[0]
        raise DatabaseUnavailable(f"{action} of {_shown(url)} failed: {first}") from None


@click.group(name="db")
def db() -> None:
    """The ledger database: migrations."""


@db.command(name="upgrade")
@click.option("--url", default=None, help="Ledger URL (default: settings ledger URL).")
@click.option("--to", "revision", default="head", show_default=True, help="Target revision.")
def upgrade_cmd(url: str | None, revision: str) -> None:
    """Apply migrations up to a revision (creates a SQLite file's folder)."""
    from ledger import migrate

    target = _url(url)
    _run("upgrade", target, lambda: migrate.upgrade(target, revision))
    click.echo(f"{_shown(target)}: at {migrate.current(target) or 'base'}")


@db.command(name="downgrade")
@click.option("--url", default=None, help="Ledger URL (default: settings ledger URL).")
@click.option("--to", "revision", default="base", show_default=True, help="Target revision.")
def downgrade_cmd(url: str | None, revision: str) -> None:
    """Revert migrations down to a revision (base removes every table)."""
    from ledger import migrate

    target = _url(url)
    _run("downgrade", target, lambda: migrate.downgrade(target, revision))
    click.echo(f"{_shown(target)}: at {migrate.current(target) or 'base'}")


@db.command(name="current")
@click.option("--url", default=None, help="Ledger URL (default: settings ledger URL).")
def current_cmd(url: str | None) -> None:
    """Print the ledger's current revision (``base`` for an empty database)."""
    from ledger import migrate

    target = _url(url)
    found: list[str | None] = []
    _run("reading the revision", target, lambda: found.append(migrate.current(target)))
    click.echo(found[0] or "base")


def register(root: click.Group) -> None:
    root.add_command(db)
