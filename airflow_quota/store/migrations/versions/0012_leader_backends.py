"""the backends the leading quota scheduler runs, recorded with its lease, so ``airflow-quota
doctor`` can tell whether the live jobs name a backend that no scheduler runs

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quota_leader", schema=None) as batch_op:
        batch_op.add_column(sa.Column("backends", sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quota_leader", schema=None) as batch_op:
        batch_op.drop_column("backends")
