"""Add the crons table: each queue's cron specs and their last admitted occurrence.

Revision ID: 0002_crons
Revises: 0001_floor
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002_crons"
down_revision = "0001_floor"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "emq_floor_crons",
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("key", sa.String(128), nullable=False),
        sa.Column("spec", sa.Text(), nullable=False),
        sa.Column("last_ms", sa.BigInteger(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("queue", "key", name="pk_emq_floor_crons"),
    )


def downgrade() -> None:
    op.drop_table("emq_floor_crons")
