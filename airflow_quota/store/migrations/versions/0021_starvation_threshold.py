"""each share's starvation threshold in the read model (docs/model.md rule 8.2): the threshold
now, the normal wait it is drawn from, whether it is fixed, and the multiple, so the Quotas page,
its API and ``airflow-quota shares`` can say when a share's waiting jobs may be starving

A row written before this revision has no threshold (None, not fixed) until the leader writes
the view afresh, which it does when it starts.

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quota_share_views", schema=None) as batch_op:
        batch_op.add_column(sa.Column("starvation_threshold_seconds", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("normal_wait_seconds", sa.Float(), nullable=True))
        batch_op.add_column(sa.Column("starvation_fixed", sa.Boolean(), nullable=False, server_default=sa.false()))
        batch_op.add_column(sa.Column("starvation_multiple", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quota_share_views", schema=None) as batch_op:
        batch_op.drop_column("starvation_multiple")
        batch_op.drop_column("starvation_fixed")
        batch_op.drop_column("normal_wait_seconds")
        batch_op.drop_column("starvation_threshold_seconds")
