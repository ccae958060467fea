"""Rows written in one statement, as Core statements on a model's table: the leader's step
writes a handful of rows of a few tables (jobs, attempts, events, inputs, the view's rows) at
every commit, and SQLAlchemy's ORM (its unit of work, its bulk UPDATE) spends on each call more
of the step's CPU than the database spends on the statement. These send the same executemany
with none of the ORM's bookkeeping: the session's objects are not refreshed and no ids come
back, which the leader never needs for what it writes this way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table, bindparam, insert, update
from sqlalchemy.orm import DeclarativeBase, Session


def table_of(model: type[DeclarativeBase]) -> Table:
    """The table a model maps."""
    table = model.__table__
    assert isinstance(table, Table)
    return table


def insert_rows(session: Session, model: type[DeclarativeBase], rows: Sequence[dict[str, Any]]) -> None:
    """INSERT ``rows`` (by column name) into ``model``'s table in the session's transaction, in
    their order, in one executemany; nothing when there are none."""
    if rows:
        session.execute(insert(table_of(model)), list(rows))


def update_by_key(session: Session, model: type[DeclarativeBase], rows: Sequence[dict[str, Any]]) -> None:
    """UPDATE ``model``'s rows, each given as its primary key's columns and the columns to set
    (by column name), in the session's transaction: one executemany for each set of columns."""
    table = table_of(model)
    keys = [column.name for column in table.primary_key.columns]
    by_columns: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for row in rows:
        missing = [key for key in keys if key not in row]
        if missing:
            raise ValueError(f"{table.name}: a row to update has no {', '.join(missing)} (its primary key)")
        columns = tuple(name for name in row if name not in keys)
        by_columns.setdefault(columns, []).append(row)
    for columns, group in by_columns.items():
        if not columns:
            continue
        statement = (
            update(table)
            .where(*(table.c[key] == bindparam(f"key_{key}") for key in keys))
            .values({name: bindparam(name) for name in columns})
        )
        session.execute(
            statement,
            [{**{f"key_{key}": row[key] for key in keys}, **{name: row[name] for name in columns}} for row in group],
        )
