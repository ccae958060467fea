"""the read model: the leader writes each share's view (``quota_share_views``,
``quota_share_type_views``) and what a new job of it could be placed on now
(``quota_placeable_views``) at every commit that changes them, and each RUNNABLE job's
``runnable_since``; readers compute ages from these instants

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "quota_share_views",
        sa.Column("share", sa.String(length=128), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("strategy", sa.String(length=20), nullable=False),
        sa.Column("state", sa.String(length=20), nullable=False),
        sa.Column("borrow_limit", sa.Integer(), nullable=True),
        sa.Column("in_share_preemption", sa.Boolean(), nullable=False),
        sa.Column("max_priority", sa.Integer(), nullable=False),
        sa.Column("running", sa.Integer(), nullable=False),
        sa.Column("runnable", sa.Integer(), nullable=False),
        sa.Column("oldest_runnable_since", sa.Float(), nullable=True),
        sa.Column("computed_at", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("share"),
    )
    op.create_table(
        "quota_share_type_views",
        sa.Column("share", sa.String(length=128), nullable=False),
        sa.Column("instance_type", sa.String(length=64), nullable=False),
        sa.Column("gpus_per_instance", sa.Integer(), nullable=False),
        sa.Column("capacity", sa.Integer(), nullable=False),
        sa.Column("limit", sa.Integer(), nullable=False),
        sa.Column("used", sa.Integer(), nullable=False),
        sa.Column("borrowed", sa.Integer(), nullable=False),
        sa.Column("lent", sa.Float(), nullable=False),
        sa.Column("idle", sa.Integer(), nullable=False),
        sa.Column("runnable", sa.Integer(), nullable=False),
        sa.Column("oldest_runnable_since", sa.Float(), nullable=True),
        sa.PrimaryKeyConstraint("share", "instance_type"),
    )
    op.create_table(
        "quota_placeable_views",
        sa.Column("share", sa.String(length=128), nullable=False),
        sa.Column("instance_type", sa.String(length=64), nullable=False),
        sa.Column("training_plan", sa.String(length=128), nullable=False),
        sa.Column("most", sa.Integer(), nullable=False),
        sa.Column("blocked_by", sa.String(length=80), nullable=True),
        sa.PrimaryKeyConstraint("share", "instance_type", "training_plan"),
    )
    with op.batch_alter_table("quota_jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("runnable_since", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quota_jobs", schema=None) as batch_op:
        batch_op.drop_column("runnable_since")
    op.drop_table("quota_placeable_views")
    op.drop_table("quota_share_type_views")
    op.drop_table("quota_share_views")
