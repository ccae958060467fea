"""the AWS Batch service job of a job placed by AWS Batch (issue 42: a quota scheduler that
delegates to a job queue, ``service/delegation.py``): its id, by which the mirror finds the job
among what ``ListServiceJobs`` returns

Revision ID: 0022
Revises: 0021
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("quota_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("service_job_id", sa.String(length=64), nullable=True))
        batch_op.create_index("ix_quota_jobs_service_job_id", ["service_job_id"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("quota_jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_quota_jobs_service_job_id")
        batch_op.drop_column("service_job_id")
