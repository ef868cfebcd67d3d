"""Run by tests/floor/test_embedded_postgres.py in a pytest subprocess (not collected on its
own): what pg_admin gives when nothing answers at the default URL."""

from __future__ import annotations

import os

import sqlalchemy as sa


def test_probe(pg_admin: sa.Engine) -> None:
    with pg_admin.connect() as conn:
        version = conn.exec_driver_sql("SHOW server_version").scalar()
    with open(os.environ["PROBE_OUT"], "w") as out:
        print(pg_admin.url.port, version, file=out)
