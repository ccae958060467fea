"""Databases for the service tests: SQLite files, and PostgreSQL databases created for the test.

PostgreSQL: the server named by ``QUOTA_TEST_POSTGRES_URL`` (an admin URL), else the machine's
server at 127.0.0.1:5432 when one answers, else a throwaway server started from Debian's
``postgresql`` package (``make test`` installs it when absent).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine

from airflow_quota.devtools.stack import free_port
from airflow_quota.store.engine import make_engine, migrate
from tests.conftest import missing
from tests.moto_server import moto_url
from tests.service.chaos import Scheduler

__all__ = ["moto_url"]  # the fixture, shared from tests/moto_server.py

DEFAULT_ADMIN = "postgresql://postgres@127.0.0.1:5432/test"


def _answers(url: str) -> bool:
    try:
        with psycopg.connect(url, connect_timeout=3):
            return True
    except psycopg.Error:
        return False


def _throwaway_server(base: Path) -> tuple[str, subprocess.Popen[bytes] | None]:
    bins = sorted(Path("/usr/lib/postgresql").glob("*/bin"))
    if not bins:
        missing("no PostgreSQL server here and Debian's postgresql package is not installed")
    bin_dir = bins[-1]
    data = base / "pgdata"
    port = free_port()
    run_as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
    base.mkdir(parents=True, exist_ok=True)
    if run_as:
        shutil.chown(base, "postgres")
    subprocess.run(
        [*run_as, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres"],
        check=True,
        capture_output=True,
    )
    server = subprocess.Popen(
        [*run_as, str(bin_dir / "postgres"), "-D", str(data), "-p", str(port), "-k", str(base), "-h", "127.0.0.1"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"postgresql://postgres@127.0.0.1:{port}/postgres"
    for _ in range(100):
        if _answers(url):
            return url, server
        time.sleep(0.1)
    server.terminate()
    missing("could not start a throwaway PostgreSQL server")


@pytest.fixture(scope="session")
def postgres_admin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    url = os.environ.get("QUOTA_TEST_POSTGRES_URL", DEFAULT_ADMIN)
    server = None
    if not _answers(url):
        url, server = _throwaway_server(tmp_path_factory.mktemp("postgres"))
    yield url
    if server is not None:
        server.terminate()
        server.wait(timeout=30)


@pytest.fixture
def postgres_url(postgres_admin: str) -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test."""
    name = f"quota_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(postgres_admin, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    base = postgres_admin.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with psycopg.connect(postgres_admin, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
