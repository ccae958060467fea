"""retention: per-hour, per-share aggregates kept for ever (``quota_share_hours``), where
retention stands (``quota_retention``); indexes on the finished jobs by when they ended, the
attempts by placement, the requests by job and by creation and the decisions by instant (issue 39)

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

FINISHED = "state IN ('SUCCEEDED','FAILED')"


def upgrade() -> None:
    op.create_table(
        "quota_share_hours",
        sa.Column("hour", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("share", sa.String(length=128), primary_key=True),
        sa.Column("used_gpu_seconds", sa.Float(), nullable=False),
        sa.Column("borrowed_gpu_seconds", sa.Float(), nullable=False),
        sa.Column("limit_gpu_seconds", sa.Float(), nullable=False),
        sa.Column("jobs_pruned", sa.Integer(), nullable=False),
        sa.Column("jobs_succeeded", sa.Integer(), nullable=False),
        sa.Column("gpu_hours", sa.Float(), nullable=False),
        sa.Column("lost_gpu_hours", sa.Float(), nullable=False),
        sa.Column("cost", sa.Float(), nullable=False),
        sa.Column("preemptions", sa.Integer(), nullable=False),
        sa.Column("wait_seconds", sa.Float(), nullable=False),
    )
    retention = op.create_table(
        "quota_retention",
        sa.Column("name", sa.String(length=20), primary_key=True),
        sa.Column("compacted_until", sa.Float(), nullable=True),
        sa.Column("first_placed_at", sa.Float(), nullable=True),
        sa.Column("pruned_at", sa.Float(), nullable=True),
        sa.Column("inputs_pruned_through", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), nullable=True),
    )
    op.bulk_insert(retention, [{"name": "retention"}])
    op.create_index(
        "ix_quota_jobs_finished",
        "quota_jobs",
        ["updated_at"],
        postgresql_where=sa.text(FINISHED),
        sqlite_where=sa.text(FINISHED),
    )
    op.create_index("ix_quota_attempts_placed", "quota_attempts", ["placed_at"])
    op.create_index("ix_quota_requests_job", "quota_requests", ["job_id"])
    op.create_index("ix_quota_requests_created", "quota_requests", ["created_at"])
    op.create_index("ix_quota_events_at", "quota_events", ["at"])


def downgrade() -> None:
    op.drop_index("ix_quota_events_at", table_name="quota_events")
    op.drop_index("ix_quota_requests_created", table_name="quota_requests")
    op.drop_index("ix_quota_requests_job", table_name="quota_requests")
    op.drop_index("ix_quota_attempts_placed", table_name="quota_attempts")
    op.drop_index("ix_quota_jobs_finished", table_name="quota_jobs")
    op.drop_table("quota_retention")
    op.drop_table("quota_share_hours")
