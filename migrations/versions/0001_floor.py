"""Create the floor: job rows and leader fences.

Revision ID: 0001_floor
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001_floor"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "emq_floor_jobs",
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("job_id", sa.String(255), nullable=False),
        sa.Column("due_ms", sa.BigInteger(), nullable=False),
        sa.Column("spilled", sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column("fields", sa.Text(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=True),
        sa.Column("updated_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("queue", "job_id", name="pk_emq_floor_jobs"),
    )
    op.create_index(
        "ix_emq_floor_jobs_queue_spilled_due",
        "emq_floor_jobs",
        ["queue", "spilled", "due_ms"],
    )
    op.create_table(
        "emq_floor_fences",
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("fence", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("queue", name="pk_emq_floor_fences"),
    )


def downgrade() -> None:
    op.drop_table("emq_floor_fences")
    op.drop_index("ix_emq_floor_jobs_queue_spilled_due", table_name="emq_floor_jobs")
    op.drop_table("emq_floor_jobs")
