"""Alembic, driven from code: the schema revision of a database, and upgrading it.

The migrations live in the repository's ``db/migrations`` (found next to the ``kvlab`` package,
never through the working directory).  An upgrade runs in one transaction that first takes a
lock, so several processes starting on an empty database at once (a dashboard launching its
workers) migrate it exactly once: ``BEGIN IMMEDIATE`` on SQLite, an advisory lock on PostgreSQL;
the others then find it at head and do nothing.
"""

from __future__ import annotations

from functools import cache

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from alembic.util.exc import CommandError
from sqlalchemy import Engine, inspect, text
from sqlalchemy.engine import Connection

from kvlab.paths import MIGRATIONS_DIR
from kvlab.store.database import URL_ENV, WRITE, mask
from kvlab.store.errors import SchemaOutdatedError, StoreError

UPGRADE_HINT = "run `kvlab db upgrade`"
#: Tables every kvlab schema has: with an unknown revision they mean a newer kvlab, without one
#: another application.
KVLAB_TABLES = {"experiments", "trials"}
#: Key of PostgreSQL's advisory lock held while migrating (any constant unique to kvlab).
_PG_MIGRATION_LOCK = 0x6B766C6162


def alembic_config(connection: Connection | None = None) -> Config:
    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise StoreError(f"kvlab's migrations are not at {MIGRATIONS_DIR}: install kvlab from a checkout "
                         "of its repository (pip install -e .)")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


@cache
def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The revision this kvlab's code expects."""
    head = _script().get_current_head()
    assert head is not None, f"no migrations in {MIGRATIONS_DIR}"
    return head


def known_revisions() -> set[str]:
    return {script.revision for script in _script().walk_revisions()}


def current_revision(connection: Connection) -> str | None:
    """The database's revision, or None when it has no kvlab schema."""
    try:
        return MigrationContext.configure(connection).get_current_revision()
    except CommandError as error:  # e.g. an alembic_version table with several rows
        raise StoreError(f"{database_name(connection)}: unreadable schema revision ({error})") from None


def has_tables(connection: Connection) -> bool:
    return bool(inspect(connection).get_table_names())


def database_name(connection: Connection) -> str:
    """The SQLite file, or the URL with its password masked: how messages name the database."""
    url = connection.engine.url
    return (url.database or ":memory:") if url.get_backend_name() == "sqlite" else mask(url)


def refuse_foreign(connection: Connection, revision: str | None) -> None:
    """Raise unless the database is empty or kvlab's at a revision this kvlab knows.

    A database with tables but no kvlab schema belongs to another application: kvlab never adds
    its tables there.  An unknown revision on a database with kvlab's tables was written by a
    newer kvlab; without kvlab's tables it is another application's alembic revision.
    """
    if revision is not None and revision in known_revisions():
        return
    tables = set(inspect(connection).get_table_names()) - {"alembic_version"}
    if revision is None and not tables:
        return
    name = database_name(connection)
    if KVLAB_TABLES <= tables and revision is not None:
        raise StoreError(f"{name}: made by a newer kvlab (revision {revision}; this kvlab knows up to "
                         f"{head_revision()}); upgrade kvlab")
    shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
    raise StoreError(f"{name}: not a kvlab database (tables {shown or 'none'}, "
                     f"{'schema revision ' + revision if revision else 'no kvlab schema revision'}); kvlab never "
                     f"adds its tables to another application's database: point {URL_ENV} at an empty file or a "
                     "kvlab database")


def check(connection: Connection) -> None:
    """Raise unless the database is at this kvlab's head revision."""
    revision, head = current_revision(connection), head_revision()
    if revision == head:
        return
    refuse_foreign(connection, revision)
    if revision is None:
        raise SchemaOutdatedError(f"database has no kvlab schema: {UPGRADE_HINT}")
    raise SchemaOutdatedError(f"database schema is at revision {revision}, this kvlab needs {head}: "
                              f"{UPGRADE_HINT}")


def upgrade(engine: Engine, revision: str = "head", only_if_empty: bool = False) -> tuple[str | None, str | None]:
    """Migrate to ``revision``; returns (revision before, revision after).

    ``only_if_empty``: do nothing unless the database has no tables at all (checked under the
    lock), which is how a new database gets its schema without a command.
    """
    with engine.connect() as connection:
        connection.execution_options(**{WRITE: True})
        with connection.begin():
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_MIGRATION_LOCK})
            before = current_revision(connection)
            if only_if_empty and (before is not None or has_tables(connection)):
                return before, before
            refuse_foreign(connection, before)
            command.upgrade(alembic_config(connection), revision)
            return before, current_revision(connection)
