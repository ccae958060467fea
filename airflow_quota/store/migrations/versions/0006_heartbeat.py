"""the leader's heartbeat: when it last renewed its lease and how often it does, so readers can
tell that no quota scheduler is running (the Quotas page's banner, the API's ``scheduler`` field)

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quota_leader", schema=None) as batch_op:
        batch_op.add_column(sa.Column("heartbeat_at", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("heartbeat_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quota_leader", schema=None) as batch_op:
        batch_op.drop_column("heartbeat_seconds")
        batch_op.drop_column("heartbeat_at")
