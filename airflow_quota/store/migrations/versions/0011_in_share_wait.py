"""each share's wait before in-share preemption in the read model, so the Quotas page can say
when a waiting job of the share may preempt a lower-priority one

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quota_share_views", schema=None) as batch_op:
        batch_op.add_column(sa.Column("in_share_preemption_after_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quota_share_views", schema=None) as batch_op:
        batch_op.drop_column("in_share_preemption_after_seconds")
