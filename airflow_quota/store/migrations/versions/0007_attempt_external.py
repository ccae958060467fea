"""where each attempt runs at its backend: the SageMaker training job's name and ARN, for the
task's result (``{"Training": DescribeTrainingJob}``), its console and log links; and the AWS
connection each job's SageMaker calls use

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quota_attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("external_name", sa.String(length=256), nullable=True))
        batch_op.add_column(sa.Column("external_arn", sa.String(length=2048), nullable=True))
    with op.batch_alter_table("quota_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("aws_conn_id", sa.String(length=250), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quota_jobs", schema=None) as batch_op:
        batch_op.drop_column("aws_conn_id")
    with op.batch_alter_table("quota_attempts", schema=None) as batch_op:
        batch_op.drop_column("external_arn")
        batch_op.drop_column("external_name")
