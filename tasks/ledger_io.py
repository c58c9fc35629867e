"""The process's ledger engine and session factory, made once from the settings.

Flows and tasks never build engines themselves: one pool per process, migrated on first use
so that a fresh embedded ledger works without a separate `evalfleet db upgrade`.
"""

from __future__ import annotations

import functools
import threading

from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from evalfleet.settings import get_settings
from ledger.db import make_engine, session_factory
from ledger.migrate import upgrade

# Alembic's context is process-global: two threads upgrading at once (an instance flow and its
# lease heartbeat, both first users) break each other with a KeyError. Upgrades are serialised.
_UPGRADE = threading.Lock()


@functools.cache
def engine() -> Engine:
    """The ledger engine of this process (schema upgraded to head on first use)."""
    url = get_settings().ledger_url
    with _UPGRADE:
        upgrade(url)
    return make_engine(url)


@functools.cache
def sessions() -> sessionmaker[Session]:
    """A session factory on ``engine()``."""
    return session_factory(engine())
