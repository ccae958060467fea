"""Rows written in one statement, as Core statements on a model's table: the leader's step
writes a handful of rows of a few tables (jobs, attempts, events, inputs, the view's rows) at
every commit, and SQLAlchemy's ORM (its unit of work, its bulk UPDATE) spends on each call more
of the step's CPU than the database spends on the statement. These send the same executemany
with none of the ORM's bookkeeping: the session's objects are not refreshed and no ids come
back, which the leader never needs for what it writes this way.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import psycopg
from sqlalchemy import Insert, Table, Update, bindparam, insert, update
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import DeclarativeBase, Session
from sqlalchemy.sql.schema import ScalarElementColumnDefault

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


def update_by_key(
    session: Session,
    model: type[DeclarativeBase],
    rows: Sequence[dict[str, Any]],
    only_if: Mapping[str, Any] | None = None,
) -> None:
    """UPDATE ``model``'s rows, each given as its primary key's columns and the columns to set
    (by column name), in the session's transaction: one executemany for each set of columns.
    With ``only_if``, a row changes only where these columns hold these values: a
    compare-and-set, whose count nobody reads."""
    table = table_of(model)
    keys = [column.name for column in table.primary_key.columns]
    guards = tuple(sorted(only_if or {}))
    guarded = {f"if_{name}": value for name, value in (only_if or {}).items()}
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
            _update_of(table, tuple(keys), columns, guards),
            [
                {**{f"key_{key}": row[key] for key in keys}, **{name: row[name] for name in columns}, **guarded}
                for row in group
            ],
        )


def insert_returning_id(session: Session, model: type[DeclarativeBase], row: dict[str, Any]) -> int:
    """INSERT one row (by column name) into ``model``'s table in the session's transaction, and
    the id the database gave it."""
    return int(session.execute(_insert_returning_id(table_of(model)), row).scalar_one())


def insert_returning_ids(session: Session, model: type[DeclarativeBase], rows: list[dict[str, Any]]) -> list[int]:
    """INSERT the rows (by column name) into ``model``'s table in one statement, and the ids the
    database gave them, in the rows' order. Not inside ``pipelined``: it waits for its rows."""
    if not rows:
        return []
    return [int(i) for i in session.execute(_insert_returning_ids(table_of(model)), rows).scalars()]


def with_defaults(model: type[DeclarativeBase], row: dict[str, Any]) -> dict[str, Any]:
    """``row`` (by column name) with every column of ``model``'s table it leaves out: the
    column's scalar default, else None. What a row written with ``insert_rows`` holds."""
    table = table_of(model)
    full = {
        column.name: column.default.arg if isinstance(column.default, ScalarElementColumnDefault) else None
        for column in table.columns
        if not column.primary_key
    }
    full.update(row)
    return full


@functools.lru_cache(maxsize=STATEMENTS_KEPT)
def _insert_returning_id(table: Table) -> Insert:
    """The INSERT of one row of a table with one primary key column, returning it; built once."""
    (key,) = table.primary_key.columns
    return insert(table).returning(key)


@functools.lru_cache(maxsize=STATEMENTS_KEPT)
def _insert_returning_ids(table: Table) -> Insert:
    """The INSERT of many rows returning their primary keys in the rows' order; built once."""
    (key,) = table.primary_key.columns
    return insert(table).returning(key, sort_by_parameter_order=True)


@functools.lru_cache(maxsize=STATEMENTS_KEPT)
def _insert_into(table: Table) -> Insert:
    """The INSERT of a table's rows, built once (SQLAlchemy then keeps its cache key), without
    RETURNING the ids (``inline``): nobody reads them, and a pipeline could not wait for them."""
    return insert(table).inline()


@functools.lru_cache(maxsize=STATEMENTS_KEPT)
def _update_of(table: Table, keys: tuple[str, ...], columns: tuple[str, ...], guards: tuple[str, ...]) -> Update:
    """The UPDATE of ``columns`` by ``keys`` where ``guards`` hold their values, built once per
    set of columns and guards."""
    return (
        update(table)
        .where(*(table.c[key] == bindparam(f"key_{key}") for key in keys))
        .where(*(table.c[name] == bindparam(f"if_{name}") for name in guards))
        .values({name: bindparam(name) for name in columns})
    )


@contextmanager
def pipelined(session: Session, commit: bool = False) -> Iterator[None]:
    """Send the block's statements without waiting for each one's answer, on PostgreSQL
    (psycopg's pipeline mode): one round trip for them all instead of one each. For writes whose
    results nobody reads (``insert_rows``, ``update_by_key``, a DELETE), with the session's own
    changes flushed before (the ORM reads each UPDATE's row count); an error of any of them is
    raised at the end of the block, and rolls the transaction back as it would have at once. A
    statement whose result is read (``insert_returning_id``) waits for it there, sending what
    was queued before it in the same round trip.

    With ``commit``, the session's transaction commits at the block's end, its COMMIT sent in
    the pipeline's last round trip: for a session not inside ``session.begin()``, which the
    block's error leaves to be rolled back when the session closes.

    Elsewhere (SQLite, in-process) the statements run as they come."""
    session.flush()
    connection = session.connection()
    if connection.dialect.name != "postgresql":
        yield
        if commit:
            session.commit()
        return
    driver = connection.connection.driver_connection
    assert isinstance(driver, psycopg.Connection)
    try:
        with driver.pipeline():
            yield
            if commit:
                session.commit()
    except BaseException as error:
        if commit:
            _roll_back(driver)
        if isinstance(error, psycopg.Error):  # raised by the pipeline's end, outside SQLAlchemy: as it raises them
            raise DBAPIError.instance(None, None, error, psycopg.Error, dialect=connection.dialect) from error
        raise


def _roll_back(driver: psycopg.Connection[Any]) -> None:
    """End the transaction a committing pipeline failed in. An error aborts the pipeline, so its
    COMMIT is never run, yet SQLAlchemy counts the transaction as ended by that COMMIT and the
    pool would hand the connection on still in it; a connection that is gone is left to the
    pool's ping."""
    if driver.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        with contextlib.suppress(psycopg.Error):
            driver.rollback()
