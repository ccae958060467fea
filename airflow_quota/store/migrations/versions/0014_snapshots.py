"""snapshots of the core's state: recovery loads the newest that loads and replays only the
inputs after it, so a restart costs the same whatever the history (issue 39)

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
"""As ``store.models.Id`` at this revision: BIGINT, INTEGER on SQLite (its rowid)."""


def upgrade() -> None:
    op.create_table(
        "quota_snapshots",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("last_input_id", Id, nullable=False),
        sa.Column("taken_at", sa.Float(), nullable=False),
        sa.Column("format", sa.Integer(), nullable=False),
        sa.Column("checksum", sa.String(length=64), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("jobs", sa.Integer(), nullable=False),
        sa.Column("payload", sa.LargeBinary(), nullable=False),
        sa.Column("leader_epoch", sa.Integer(), nullable=True),
    )
    op.create_index("ix_quota_snapshots_last_input_id", "quota_snapshots", ["last_input_id"])


def downgrade() -> None:
    op.drop_index("ix_quota_snapshots_last_input_id", table_name="quota_snapshots")
    op.drop_table("quota_snapshots")
