"""ids 64-bit on PostgreSQL: every id and every column that refers to one becomes BIGINT, and
the sequences behind the ids count as BIGINT, so any id the API and the command line accept
(1 to 2^63-1) can be stored and looked up (issue 39); SQLite's INTEGER is 64-bit already

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

from alembic import op
from sqlalchemy import text

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

ID_COLUMNS: dict[str, tuple[str, ...]] = {
    "quota_config_versions": ("id",),
    "quota_requests": ("id", "job_id"),
    "quota_jobs": ("id",),
    "quota_attempts": ("job_id",),
    "quota_task_reports": ("job_id",),
    "quota_preemptions": ("id", "job_id"),
    "quota_alerts": ("id", "job_id"),
    "quota_events": ("id", "job_id"),
    "quota_inputs": ("id",),
}
"""Per table, its id and the columns that hold a job's id (``store.models.Id``)."""


def _retype(sql_type: str) -> None:
    """Every column of ``ID_COLUMNS`` and every id's sequence as ``sql_type``, one rewrite per
    table (PostgreSQL only; nothing to do on SQLite)."""
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    for table, columns in ID_COLUMNS.items():
        changes = ", ".join(f"ALTER COLUMN {column} TYPE {sql_type}" for column in columns)
        op.execute(f"ALTER TABLE {table} {changes}")
        if "id" in columns:
            sequence = bind.scalar(text("SELECT pg_get_serial_sequence(:table, 'id')"), {"table": table})
            if sequence is not None:  # a SERIAL's sequence stays INTEGER (at most 2^31-1) unless told
                op.execute(f"ALTER SEQUENCE {sequence} AS {sql_type}")


def upgrade() -> None:
    _retype("BIGINT")


def downgrade() -> None:
    """Back to 32-bit ids; fails ("integer out of range") while a row holds an id above 2^31-1."""
    _retype("INTEGER")
