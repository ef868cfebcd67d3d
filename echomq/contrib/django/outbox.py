"""``ADMIT: "outbox"``: inside ``transaction.atomic()``, an add writes the job into the
transactional outbox through Django's own connection, in its transaction; the
supervisor's relay (``--outbox-url`` naming this database) admits it once committed.

The table is created by this app's migration (``manage.py migrate``) from the floor's
own definition, :data:`echomq.floor.schema.outbox`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.db import connections

from echomq import outbox
from echomq.deferral import Outboxer
from echomq.errors import OutboxError
from echomq.floor.schema import outbox as outbox_table

_checked: set[tuple[str, str]] = set()  # (alias, database name) known to hold the table


def in_outbox(database: str) -> Outboxer:
    """An outboxer (:mod:`echomq.deferral`) that writes jobs added inside an atomic block
    of ``database`` into its outbox table, in that transaction. Outside a transaction it
    declines (the add is admitted at once)."""

    def write(queue: str, specs: Sequence[Any]) -> bool:
        conn = connections[database]
        if not conn.in_atomic_block:
            return False
        key = (database, str(conn.settings_dict.get("NAME")))
        with conn.cursor() as cursor:
            if key not in _checked:
                if outbox_table.name not in conn.introspection.table_names(cursor):
                    raise OutboxError(
                        f"ADMIT 'outbox': the database {database!r} has no outbox table "
                        f"({outbox_table.name}); run `python manage.py migrate echomq`. "
                        "Nothing was written")
                _checked.add(key)
            # Django's cursors take "format" (%s) parameters on every backend
            outbox.write_cursor(cursor, queue, specs, paramstyle="format",
                                postgresql=conn.vendor == "postgresql")
        return True

    return write


def database_url(settings_dict: dict[str, Any]) -> str | None:
    """The SQLAlchemy URL of a Django database (SQLite and PostgreSQL; else None: give
    ``--outbox-url`` yourself), for the supervisor's relay."""
    from sqlalchemy.engine import URL

    engine = str(settings_dict.get("ENGINE", ""))
    if engine.endswith("sqlite3"):
        return f"sqlite:///{settings_dict['NAME']}"
    if not engine.endswith(("postgresql", "postgis")):
        return None
    port = settings_dict.get("PORT")
    return URL.create("postgresql+psycopg", username=settings_dict.get("USER") or None,
                      password=settings_dict.get("PASSWORD") or None,
                      host=settings_dict.get("HOST") or None,
                      port=int(port) if port else None,
                      database=settings_dict.get("NAME") or None,
                      ).render_as_string(hide_password=False)


def _ddl(schema_editor: Any, create: bool) -> list[str]:
    from sqlalchemy.dialects import registry
    from sqlalchemy.schema import CreateIndex, CreateTable, DropTable

    dialect = registry.load(schema_editor.connection.vendor)()
    if not create:
        return [str(DropTable(outbox_table, if_exists=True).compile(dialect=dialect))]
    statements = [CreateTable(outbox_table, if_not_exists=True)]
    statements += [CreateIndex(ix, if_not_exists=True) for ix in outbox_table.indexes]
    return [str(s.compile(dialect=dialect)).strip() for s in statements]


def create_outbox(apps: Any, schema_editor: Any) -> None:
    """The migration's forward step: the floor's outbox table and index, if absent."""
    for sql in _ddl(schema_editor, create=True):
        schema_editor.execute(sql)


def drop_outbox(apps: Any, schema_editor: Any) -> None:
    """The migration's backward step."""
    for sql in _ddl(schema_editor, create=False):
        schema_editor.execute(sql)
