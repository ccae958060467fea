"""the map index of the task instance that submitted a job, so the Quotas page links to a
mapped task instance (``/mapped/{index}``) and not to the mapped task as a whole

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quota_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("map_index", sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quota_jobs", schema=None) as batch_op:
        batch_op.drop_column("map_index")
