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
from sqlalchemy import Engine, inspect, text
from sqlalchemy.engine import Connection

from kvlab.store.engine import REPO_ROOT, WRITE
from kvlab.store.errors import SchemaOutdatedError, StoreError

MIGRATIONS_DIR = REPO_ROOT / "db" / "migrations"
UPGRADE_HINT = "run `kvlab db upgrade`"
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
    return MigrationContext.configure(connection).get_current_revision()


def has_tables(connection: Connection) -> bool:
    return bool(inspect(connection).get_table_names())


def check(connection: Connection) -> None:
    """Raise unless the database is at this kvlab's head revision."""
    revision, head = current_revision(connection), head_revision()
    if revision == head:
        return
    if revision is None:
        if has_tables(connection):
            raise StoreError("the database has tables but no kvlab schema revision: it is not a kvlab "
                             "database; point KVLAB_DATABASE_URL at an empty or a kvlab database")
        raise SchemaOutdatedError(f"database has no kvlab schema: {UPGRADE_HINT}")
    if revision not in known_revisions():
        raise StoreError(f"database schema is at revision {revision}, which this kvlab does not know "
                         f"(a newer kvlab migrated it): upgrade kvlab")
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
            command.upgrade(alembic_config(connection), revision)
            return before, current_revision(connection)
