"""alerts keep the job's age and their delivery to the notifiers (at most once per notifier)

Alerts recorded before this revision were never sent anywhere; they are marked delivered
(``notified_at`` = their time) so that upgrading does not send a flood of stale alerts.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quota_alerts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("age_seconds", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("notified_at", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("deliveries", sa.JSON(), nullable=True))
        batch_op.create_index("ix_quota_alerts_undelivered", ["notified_at"], unique=False)
    op.execute("UPDATE quota_alerts SET notified_at = at WHERE notified_at IS NULL")


def downgrade() -> None:
    with op.batch_alter_table("quota_alerts", schema=None) as batch_op:
        batch_op.drop_index("ix_quota_alerts_undelivered")
        batch_op.drop_column("deliveries")
        batch_op.drop_column("notified_at")
        batch_op.drop_column("age_seconds")
