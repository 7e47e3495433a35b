"""Alembic environment for kvlab's store.

``kvlab.store.migrate`` passes an open connection (``config.attributes["connection"]``), inside a
transaction that holds the migration lock.  Run from the alembic command line
(``alembic -c db/alembic.ini ...``), it connects to the store's URL with kvlab's engine settings.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from kvlab.store.database import create_store_engine, resolve_url
from kvlab.store.tables import Base

config = context.config


def run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # SQLite cannot ALTER most things: autogenerate batch (copy-and-move) operations for it.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    context.configure(url=resolve_url(config.get_main_option("sqlalchemy.url")), target_metadata=Base.metadata,
                      literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif (given := config.attributes.get("connection")) is not None:
    run(given)
else:
    engine = create_store_engine(resolve_url(config.get_main_option("sqlalchemy.url")))
    with engine.begin() as connection:
        run(connection)
    engine.dispose()
