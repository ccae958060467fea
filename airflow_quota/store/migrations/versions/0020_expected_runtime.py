"""the runtime the author expects of a job (the operator's ``expected_runtime``), the
forecast's best runtime estimate (issue 41)

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quota_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("expected_runtime_seconds", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quota_jobs", schema=None) as batch_op:
        batch_op.drop_column("expected_runtime_seconds")
