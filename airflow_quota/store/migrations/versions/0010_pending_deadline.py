"""when a RUNNABLE job's ``max_pending_seconds`` falls due (the core's deadline), so the task log
can say when the wait ends without re-deriving it from the job's request

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quota_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("pending_deadline", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quota_jobs", schema=None) as batch_op:
        batch_op.drop_column("pending_deadline")
