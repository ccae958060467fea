"""retention's search for decisions and requests of no job reads only the candidates: partial
indexes on the refusals (and the rows of no job at all) replace the indexes on every decision's
and request's instant, whose entries of pruned jobs the first search after a backlog walked
(issue 39: 74-132 ms at 100,000 jobs)

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

UNATTACHED_EVENTS = "job_id IS NULL OR type = 'REJECTED'"
REFUSED_REQUESTS = "handled AND kind <> 'config' AND (job_id IS NULL OR outcome = 'refused')"


def upgrade() -> None:
    op.drop_index("ix_quota_events_at", table_name="quota_events")
    op.drop_index("ix_quota_requests_created", table_name="quota_requests")
    for name, table, column, where in (
        ("ix_quota_events_unattached", "quota_events", "at", UNATTACHED_EVENTS),
        ("ix_quota_requests_refused", "quota_requests", "created_at", REFUSED_REQUESTS),
    ):
        op.create_index(name, table, [column], postgresql_where=sa.text(where), sqlite_where=sa.text(where))


def downgrade() -> None:
    op.drop_index("ix_quota_requests_refused", table_name="quota_requests")
    op.drop_index("ix_quota_events_unattached", table_name="quota_events")
    op.create_index("ix_quota_requests_created", "quota_requests", ["created_at"])
    op.create_index("ix_quota_events_at", "quota_events", ["at"])
