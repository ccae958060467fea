"""the forecast of every live job: quota_forecasts (issue 41)

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    op.create_table(
        "quota_forecasts",
        sa.Column("job_id", Id, primary_key=True, autoincrement=False),
        sa.Column("made_at", sa.Float(), nullable=False),
        sa.Column("start", sa.Float(), nullable=True),
        sa.Column("low", sa.Float(), nullable=True),
        sa.Column("high", sa.Float(), nullable=True),
        sa.Column("end", sa.Float(), nullable=True),
        sa.Column("instance_type", sa.String(64), nullable=True),
        sa.Column("count", sa.Integer(), nullable=True),
        sa.Column("borrowed", sa.Integer(), nullable=False),
        sa.Column("preempts", sa.Boolean(), nullable=False),
        sa.Column("must_borrow", sa.Integer(), nullable=False),
        sa.Column("source", sa.String(32), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("quota_forecasts")
