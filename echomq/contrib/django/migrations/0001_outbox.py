"""The transactional outbox table (``ADMIT: "outbox"``), created by ``manage.py migrate``.

Its DDL is the floor's own (:data:`echomq.floor.schema.outbox`), compiled for this
database, so the table is the one ``echomq-supervisor migrate`` would create; an outbox
table already there (the floor's, on the same database) is left as it is.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from echomq.contrib.django.outbox import create_outbox, drop_outbox


class Migration(migrations.Migration):  # type: ignore[misc]  # Django has no type hints
    initial = True
    dependencies: list[Any] = []
    operations = [migrations.RunPython(create_outbox, drop_outbox, elidable=False)]
