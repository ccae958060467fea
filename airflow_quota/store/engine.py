"""Engines, sessions and migrations for the quota database."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from importlib import resources
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session, sessionmaker

from airflow_quota.exceptions import DatabaseUnavailable
from airflow_quota.store.settings import redacted

__all__ = ["DatabaseUnavailable", "make_engine", "migrate", "reachable", "session_factory"]


def make_engine(url: str, **kwargs: Any) -> Engine:
    """An engine for the quota database; SQLite gets WAL and a busy timeout so readers and the
    single writer get along."""
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30}, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _: Any) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(url, pool_pre_ping=True, **kwargs)


def session_factory(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


@contextmanager
def reachable(url: str) -> Iterator[None]:
    """Turn a connection failure into one clear line naming the database."""
    try:
        yield
    except OperationalError as exc:
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
        raise DatabaseUnavailable(f"quota database {redacted(url)} is unreachable: {reason}") from exc


def _alembic_config(engine: Engine) -> Config:
    config = Config()
    config.set_main_option("script_location", str(resources.files("airflow_quota.store") / "migrations"))
    config.set_main_option("sqlalchemy.url", engine.url.render_as_string(hide_password=False))
    return config


def migrate(engine: Engine) -> tuple[str | None, str]:
    """Create or upgrade the schema to the newest revision; returns (from, to) revisions."""
    logging.getLogger("alembic").setLevel(logging.WARNING)
    config = _alembic_config(engine)
    with reachable(str(engine.url)), engine.connect() as connection:
        sqlite = engine.dialect.name == "sqlite"
        if sqlite:  # a migration that rebuilds a table drops and renames it (SQLite's way): not a delete
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")  # outside a transaction, or it does nothing
            connection.commit()  # ends SQLAlchemy's autobegun transaction (SQLite began none)
        try:
            with connection.begin():
                before = MigrationContext.configure(connection).get_current_revision()
                config.attributes["connection"] = connection
                command.upgrade(config, "head")
                if sqlite and (broken := connection.exec_driver_sql("PRAGMA foreign_key_check").first()):
                    raise RuntimeError(f"migrating left a row whose reference is broken: {tuple(broken)}")
        finally:
            if sqlite:
                connection.exec_driver_sql("PRAGMA foreign_keys=ON")
                connection.commit()
    head = ScriptDirectory.from_config(config).get_current_head()
    return before, str(head)


def current_revision(engine: Engine) -> str | None:
    with reachable(str(engine.url)), engine.connect() as connection:
        return MigrationContext.configure(connection).get_current_revision()


def head_revision(engine: Engine) -> str | None:
    return ScriptDirectory.from_config(_alembic_config(engine)).get_current_head()


def known_revision(engine: Engine, revision: str) -> bool:
    """Whether ``revision`` is one of this airflow-quota's migrations (a database migrated by a
    newer version is not)."""
    scripts = ScriptDirectory.from_config(_alembic_config(engine))
    return any(script.revision == revision for script in scripts.walk_revisions())
