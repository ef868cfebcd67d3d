"""The floor's tables, as SQLAlchemy Core metadata.

The migrations in ``migrations/versions`` create these tables; this metadata is
what the code queries with (and what Alembic compares against). Production
code never calls ``metadata.create_all``.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    false,
)

# Our own version table, so a floor can share a database with an application
# that runs its own Alembic migrations (whose table is ``alembic_version``).
VERSION_TABLE = "emq_alembic_version"

metadata = MetaData()

jobs = Table(
    "emq_floor_jobs",
    metadata,
    Column("queue", String(128), primary_key=True),
    Column("job_id", String(255), primary_key=True),
    Column("due_ms", BigInteger, nullable=False),
    Column("spilled", Boolean, nullable=False, default=False, server_default=false()),
    # The job's Redis hash as a JSON object of str -> str.
    Column("fields", Text, nullable=False),
    Column("created_ms", BigInteger),
    Column("updated_ms", BigInteger),
    # (revision 0004) a "durable" producer's admit order: rehydration keeps lanes in it
    Column("seq", BigInteger),
)

Index("ix_emq_floor_jobs_queue_spilled_due", jobs.c.queue, jobs.c.spilled, jobs.c.due_ms)

fences = Table(
    "emq_floor_fences",
    metadata,
    Column("queue", String(128), primary_key=True),
    Column("fence", BigInteger, nullable=False),
)

# Crons (added in revision 0002): the spec as add_cron stored it in Valkey, and the due
# time of the last occurrence admitted, so a Valkey that lost them gets them back.
crons = Table(
    "emq_floor_crons",
    metadata,
    Column("queue", String(128), primary_key=True),
    Column("key", String(128), primary_key=True),
    Column("spec", Text, nullable=False),
    Column("last_ms", BigInteger, nullable=False),
    Column("updated_ms", BigInteger),
)

# Lane limits (added in revision 0003): the value set_lane_limit stored in Valkey
# ("max_active rate per_ms"), per lane ("*": the queue default), so a Valkey that lost
# them gets them back.
lane_limits = Table(
    "emq_floor_lane_limits",
    metadata,
    Column("queue", String(128), primary_key=True),
    Column("lane", String(128), primary_key=True),
    Column("value", String(128), nullable=False),
    Column("updated_ms", BigInteger),
)

# The transactional outbox (revision 0004): jobs written in an application's transaction
# (``Queue.add(..., tx=conn)``), admitted to Valkey by the leader scheduler after commit.
outbox = Table(
    "emq_outbox",
    metadata,
    Column("id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True,
           autoincrement=True),
    Column("queue", String(128), nullable=False),
    Column("job_id", String(255), nullable=False),
    # the job as its admit takes it: JSON {"args": [...], "due": int | null}
    Column("spec", Text, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
)

Index("ix_emq_outbox_queue_id", outbox.c.queue, outbox.c.id)
