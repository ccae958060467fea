"""what QuotaExecutor reports of the Airflow tries that run its jobs' attempts (the ``airflow``
backend reads them): running since when, and how each try ended; and the backend's requests to
stop a try (preemption, cancel), which the executor reads

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "quota_task_reports",
        sa.Column("job_id", sa.Integer(), sa.ForeignKey("quota_jobs.id"), primary_key=True),
        sa.Column("attempt", sa.Integer(), primary_key=True),
        sa.Column("status", sa.String(20), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("running_since", sa.Float(), nullable=True),
        sa.Column("ended_at", sa.Float(), nullable=True),
        sa.Column("try_number", sa.Integer(), nullable=True),
        sa.Column("stop_requested_at", sa.Float(), nullable=True),
        sa.Column("stop_grace", sa.Float(), nullable=True),
        sa.Column("updated_at", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("quota_task_reports")
