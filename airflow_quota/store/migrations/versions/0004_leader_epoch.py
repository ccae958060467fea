"""the leader row becomes a fenced lease: an epoch bumped at every takeover, and the PostgreSQL
backend pid of the leader's lease connection; each decision records the epoch it was committed in

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quota_leader", schema=None) as batch_op:
        batch_op.add_column(sa.Column("epoch", sa.Integer(), nullable=False, server_default=sa.text("0")))
        batch_op.add_column(sa.Column("holder_pid", sa.Integer(), nullable=True))
    with op.batch_alter_table("quota_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("leader_epoch", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quota_events", schema=None) as batch_op:
        batch_op.drop_column("leader_epoch")
    with op.batch_alter_table("quota_leader", schema=None) as batch_op:
        batch_op.drop_column("holder_pid")
        batch_op.drop_column("epoch")
