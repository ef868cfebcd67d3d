"""The durable dial's order column on floor rows, and the transactional outbox table.

Revision ID: 0004_durable
Revises: 0003_lane_limits
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004_durable"
down_revision = "0003_lane_limits"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # the admit order of a job written by a producer under the "durable" dial
    # (nanoseconds since the epoch, plus its place in its add_many): rehydration puts
    # waiting jobs back on their lanes in this order
    with op.batch_alter_table("emq_floor_jobs") as batch:
        batch.add_column(sa.Column("seq", sa.BigInteger(), nullable=True))
    op.create_table(
        "emq_outbox",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                  primary_key=True, autoincrement=True),
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("job_id", sa.String(255), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_emq_outbox_queue_id", "emq_outbox", ["queue", "id"])


def downgrade() -> None:
    op.drop_index("ix_emq_outbox_queue_id", table_name="emq_outbox")
    op.drop_table("emq_outbox")
    with op.batch_alter_table("emq_floor_jobs") as batch:
        batch.drop_column("seq")
