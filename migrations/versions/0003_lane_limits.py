"""Add the lane limits table: each queue's lane limits, restored after Valkey loses them.

Revision ID: 0003_lane_limits
Revises: 0002_crons
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_lane_limits"
down_revision = "0002_crons"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "emq_floor_lane_limits",
        sa.Column("queue", sa.String(128), nullable=False),
        sa.Column("lane", sa.String(128), nullable=False),
        sa.Column("value", sa.String(128), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint("queue", "lane", name="pk_emq_floor_lane_limits"),
    )


def downgrade() -> None:
    op.drop_table("emq_floor_lane_limits")
