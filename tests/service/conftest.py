"""Databases for the service tests: SQLite files, and PostgreSQL databases created for the test
(``postgres_admin`` and ``postgres_url``, from ``tests/postgres.py``, which says which server)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from airflow_quota.store.engine import make_engine, migrate
from tests.moto_server import moto_url
from tests.postgres import postgres_admin, postgres_url
from tests.service.chaos import Scheduler

__all__ = ["moto_url", "postgres_admin", "postgres_url"]  # the fixtures, shared from their modules


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'quota.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test that takes it runs on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'quota.db'}"
    return str(request.getfixturevalue("postgres_url"))


@pytest.fixture
def engine(db_url: str) -> Iterator[Engine]:
    from airflow_quota.store.settings import normalize

    engine = make_engine(normalize(db_url))
    migrate(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def schedulers() -> Iterator[list[Scheduler]]:
    """Every ``airflow-quota scheduler`` a test starts goes in here, and is killed at the end
    whatever happens (``chaos.Scheduler``)."""
    started: list[Scheduler] = []
    yield started
    for scheduler in started:
        scheduler.kill()
