"""the decision log keeps the job's id (a name may be reused once its job is final)

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quota_events", schema=None) as batch_op:
        batch_op.add_column(sa.Column("job_id", sa.Integer(), nullable=True))
        batch_op.create_index("ix_quota_events_job_id", ["job_id"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("quota_events", schema=None) as batch_op:
        batch_op.drop_index("ix_quota_events_job_id")
        batch_op.drop_column("job_id")
