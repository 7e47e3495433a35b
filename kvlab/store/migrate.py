"""Alembic, driven from code: the schema revision of a database, and upgrading it.

The migrations live in the repository's ``db/migrations`` (found next to the ``kvlab`` package,
never through the working directory).  An upgrade runs in one transaction that first takes a
lock, so several processes starting on an empty database at once (a dashboard launching its
workers) migrate it exactly once: ``BEGIN IMMEDIATE`` on SQLite, an advisory lock on PostgreSQL;
the others then find it at head and do nothing.
"""

from __future__ import annotations

import re
from functools import cache
from typing import TYPE_CHECKING

from sqlalchemy import Engine, inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import DBAPIError

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

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
    from alembic.config import Config

    if not (MIGRATIONS_DIR / "env.py").is_file():
        raise StoreError(f"kvlab's migrations are not at {MIGRATIONS_DIR}: install kvlab from a checkout "
                         "of its repository (pip install -e .)")
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["connection"] = connection
    return config


@cache
def _script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


# A migration's module-level ids, as db/migrations/script.py.mako writes them.
_REVISION = re.compile(r'^revision = "([^"]+)"$', re.MULTILINE)
_DOWN_REVISION = re.compile(r'^down_revision = (?:"([^"]+)"|None)$', re.MULTILINE)


@cache
def head_revision() -> str:
    """The revision this kvlab's code expects: the one migration no other revises.

    Read from the migration files' ``revision`` / ``down_revision`` lines rather than through alembic, whose
    import alone takes 0.2 s of every ``kvlab ls`` (tests/store check that alembic names the same head).
    """
    revisions, revised = set(), set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        source = path.read_text(encoding="utf-8")
        if (revision := _REVISION.search(source)) and (down := _DOWN_REVISION.search(source)):
            revisions.add(revision.group(1))
            revised.add(down.group(1))
    heads = revisions - revised
    assert len(heads) == 1, f"migrations in {MIGRATIONS_DIR} have heads {sorted(heads)}, not one"
    return heads.pop()


def known_revisions() -> set[str]:
    return {script.revision for script in _script().walk_revisions()}


def current_revision(connection: Connection) -> str | None:
    """The database's revision, or None when it has no kvlab schema."""
    from alembic.runtime.migration import MigrationContext
    from alembic.util.exc import CommandError

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
    """Raise unless the database is at this kvlab's head revision (at head, without importing alembic)."""
    if stamped_revision(connection) == head_revision():
        return
    revision, head = current_revision(connection), head_revision()
    if revision == head:
        return
    refuse_foreign(connection, revision)
    if revision is None:
        raise SchemaOutdatedError(f"database has no kvlab schema: {UPGRADE_HINT}")
    raise SchemaOutdatedError(f"database schema is at revision {revision}, this kvlab needs {head}: "
                              f"{UPGRADE_HINT}")


def stamped_revision(connection: Connection) -> str | None:
    """The one revision in ``alembic_version``, else None (no such table, several rows: alembic then says)."""
    try:
        with connection.begin_nested() if connection.in_transaction() else connection.begin():
            rows = connection.execute(text("SELECT version_num FROM alembic_version")).fetchall()
    except DBAPIError:
        return None
    return rows[0][0] if len(rows) == 1 else None


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
            from alembic import command

            command.upgrade(alembic_config(connection), revision)
            return before, current_revision(connection)
