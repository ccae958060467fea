"""SQLite: ids are never given again (``AUTOINCREMENT``). A table's rowid alone is the largest id
in it plus one, so the job submitted after a refused one (its row deleted at the refusal) got
the refused job's id, and with it that refusal's decision in its history; a pruned newest job's
id would come back the same way. Each table with an id is rebuilt with ``AUTOINCREMENT``, its
rows, indexes and ids kept. PostgreSQL's sequences never go back: nothing to do there.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

TABLES = (
    "quota_config_versions",
    "quota_requests",
    "quota_jobs",
    "quota_preemptions",
    "quota_alerts",
    "quota_events",
    "quota_inputs",
    "quota_snapshots",
)
"""The tables whose primary key is an id SQLite numbers (``store.models.Id``)."""


def _rebuild(autoincrement: bool) -> None:
    if op.get_bind().dialect.name != "sqlite":
        return
    for table in TABLES:
        # the rows are copied as they are (the ids too); store.engine.migrate runs the migrations
        # with foreign keys off on SQLite, as a rebuilt table is dropped and renamed
        with op.batch_alter_table(table, recreate="always", table_kwargs={"sqlite_autoincrement": autoincrement}):
            pass


def upgrade() -> None:
    _rebuild(autoincrement=True)


def downgrade() -> None:
    _rebuild(autoincrement=False)
