"""The archive's database: one engine per URL and process, its tables brought up to date by the
Alembic migrations in migrations/ (``leash archive migrate``, and once per process before its
first archive read or write: the web app and the workers migrate at start)."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import SQLAlchemyError

from jobs.config import stores

MIGRATIONS = Path(__file__).resolve().parent / "migrations"
#: Seconds a connection attempt to an unreachable archive may take before the archive is "behind".
CONNECT_TIMEOUT = 3
#: Postgres advisory lock held while migrating, so two processes starting at once migrate once.
MIGRATION_LOCK = 4242_0042

_engines: dict[tuple[int, str], Engine] = {}
_migrated: set[tuple[int, str]] = set()
_lock = threading.Lock()


def configured_url() -> str | None:
    """LEASH_ARCHIVE_URL, else DATABASE_URL (None: no archive; results stay in Redis)."""
    return stores.archive().url


#: What the start-up log and ``leash doctor`` say of a deploy without an archive.
NO_ARCHIVE = ("no archive: neither LEASH_ARCHIVE_URL nor DATABASE_URL is set, so ended jobs' results stay in Redis "
              "for LEASH_RESULT_TTL (add a database to keep them in SQL: docs/ARCHIVE.md)")


def startup_warning() -> str | None:
    """What a web or worker process logs at start about where results are kept: a warning
    without an archive, else None."""
    return NO_ARCHIVE if configured_url() is None else None


def engine(url: str | None = None, migrate_first: bool = True) -> Engine | None:
    """The engine of ``url`` (default: the configured archive; None when there is none), its
    tables migrated before first use in this process. A forked process gets engines of its own."""
    url = url or configured_url()
    if not url:
        return None
    key = (os.getpid(), url)
    with _lock:
        found = _engines.get(key)
        if found is None:
            found = _engines[key] = _create(url)
    if migrate_first and key not in _migrated:
        migrate(found)
        _migrated.add(key)
    return found


def engine_for(connection) -> Engine | None:
    """The archive the jobs of Redis ``connection`` go to: the configured one, else the one of the
    ``leash dev`` whose Redis it is (the command line marks its connection so); None: none."""
    return engine(None if configured_url() else getattr(connection, "leash_archive_url", None))


def _create(url: str) -> Engine:
    if url.startswith("sqlite"):
        made = create_engine(url, connect_args={"timeout": 30})

        @event.listens_for(made, "connect")
        def _pragmas(dbapi_connection, _record) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")  # readers never wait for the archive's writer
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.close()

        return made
    connect_args = {"connect_timeout": CONNECT_TIMEOUT} if url.startswith("postgresql") else {}
    return create_engine(url, pool_pre_ping=True, connect_args=connect_args)


def _config(connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def migrate(engine_: Engine) -> str | None:
    """Bring the tables to the newest migration; returns the version now applied. Two processes
    migrating at once: PostgreSQL serialises them on an advisory lock; SQLite on its write lock
    (the loser sees the tables made and finds nothing left to do)."""
    for attempt in range(3):
        try:
            with engine_.begin() as connection:
                if connection.dialect.name == "postgresql":
                    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK})
                command.upgrade(_config(connection), "head")
                return MigrationContext.configure(
                    connection, opts={"version_table": "leash_alembic_version"}).get_current_revision()
        except SQLAlchemyError:
            if attempt == 2 or engine_.dialect.name != "sqlite":
                raise
    return None  # not reached


def versions(engine_: Engine) -> tuple[str | None, str]:
    """(the version applied, the newest this release knows)."""
    with engine_.connect() as connection:
        current = MigrationContext.configure(
            connection, opts={"version_table": "leash_alembic_version"}).get_current_revision()
    return current, ScriptDirectory(str(MIGRATIONS)).get_current_head()


def forget() -> None:
    """Drop this process's engines (tests that point the archive elsewhere)."""
    with _lock:
        for made in _engines.values():
            made.dispose()
        _engines.clear()
        _migrated.clear()
