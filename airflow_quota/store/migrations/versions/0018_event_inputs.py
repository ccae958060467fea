"""every decision names the input that caused it: quota_events.input_id (issue 40)

Revision ID: 0018
Revises: 0017
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("quota_events") as batch:
        batch.add_column(sa.Column("input_id", Id, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quota_events") as batch:
        batch.drop_column("input_id")
