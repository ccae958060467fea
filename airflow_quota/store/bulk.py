"""Rows written in one statement, as Core statements on a model's table: the leader's step
writes a handful of rows of a few tables (jobs, attempts, events, inputs, the view's rows) at
every commit, and SQLAlchemy's ORM (its unit of work, its bulk UPDATE) spends on each call more
of the step's CPU than the database spends on the statement. These send the same executemany
with none of the ORM's bookkeeping: the session's objects are not refreshed and no ids come
back, which the leader never needs for what it writes this way.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy import Insert, Table, Update, bindparam, insert, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import DeclarativeBase, Session

STATEMENTS_KEPT = 256
"""Statements built once and kept: a table's INSERT, and each set of columns' UPDATE (a handful)."""


def table_of(model: type[DeclarativeBase]) -> Table:
    """The table a model maps."""
    table = model.__table__
    assert isinstance(table, Table)
    return table


def insert_rows(session: Session, model: type[DeclarativeBase], rows: Sequence[dict[str, Any]]) -> None:
    """INSERT ``rows`` (by column name) into ``model``'s table in the session's transaction, in
    their order, in one executemany; nothing when there are none."""
    if rows:
        session.execute(_insert_into(table_of(model)), list(rows))


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
        session.execute(
            _update_of(table, tuple(keys), columns),
            [{**{f"key_{key}": row[key] for key in keys}, **{name: row[name] for name in columns}} for row in group],
        )


@functools.lru_cache(maxsize=STATEMENTS_KEPT)
def _insert_into(table: Table) -> Insert:
    """The INSERT of a table's rows, built once (SQLAlchemy then keeps its cache key), without
    RETURNING the ids (``inline``): nobody reads them, and a pipeline could not wait for them."""
    return insert(table).inline()


@functools.lru_cache(maxsize=STATEMENTS_KEPT)
def _update_of(table: Table, keys: tuple[str, ...], columns: tuple[str, ...]) -> Update:
    """The UPDATE of ``columns`` by ``keys``, built once per set of columns."""
    return (
        update(table)
        .where(*(table.c[key] == bindparam(f"key_{key}") for key in keys))
        .values({name: bindparam(name) for name in columns})
    )


@contextmanager
def pipelined(session: Session) -> Iterator[None]:
    """Send the block's statements without waiting for each one's answer, on PostgreSQL
    (psycopg's pipeline mode): one round trip for them all instead of one each. For writes whose
    results nobody reads (``insert_rows``, ``update_by_key``, a DELETE), with the session's own
    changes flushed before (the ORM reads each UPDATE's row count); an error of any of them is
    raised at the end of the block, and rolls the transaction back as it would have at once.
    Elsewhere (SQLite, in-process) the statements run as they come."""
    session.flush()
    connection = session.connection()
    if connection.dialect.name != "postgresql":
        yield
        return
    try:
        with connection.connection.driver_connection.pipeline():  # type: ignore[union-attr]
            yield
    except psycopg.Error as error:  # raised by the pipeline's end, outside SQLAlchemy: as it raises them
        raise DBAPIError.instance(None, None, error, psycopg.Error, dialect=connection.dialect) from error
