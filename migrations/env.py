"""Alembic environment for the EchoMQ floor.

Programmatic callers (``echomq.floor.Floor``) pass an open connection in
``config.attributes["connection"]`` (Alembic's "sharing a connection" recipe)
and own its transaction. The alembic CLI gets a URL from
``-x floor_url=...`` or the ``sqlalchemy.url`` option instead.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from echomq.floor.engine import WRITE_OPTION, make_engine, normalize_url
from echomq.floor.schema import VERSION_TABLE, metadata

config = context.config


def _url() -> str:
    url = context.get_x_argument(as_dictionary=True).get("floor_url")
    url = url or config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no floor URL: pass -x floor_url=URL")
    return url


def _configure(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        render_as_batch=connection.dialect.name == "sqlite",
    )


def run_migrations_offline() -> None:
    context.configure(
        url=normalize_url(_url()),
        target_metadata=metadata,
        version_table=VERSION_TABLE,
        literal_binds=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            connection.execution_options(**{WRITE_OPTION: True})
            _configure(connection)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
