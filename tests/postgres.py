"""PostgreSQL databases created for a test: the ``postgres_admin`` and ``postgres_url`` fixtures,
imported by the conftest or test module that needs them (``tests/service/conftest.py``, the
id-range tests of the API and the command line).

The server is the one named by ``QUOTA_TEST_POSTGRES_URL`` (an admin URL), else the machine's
server at 127.0.0.1:5432 when one answers, else a throwaway server started from Debian's
``postgresql`` package (``make test`` installs it when absent).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text

from airflow_quota.devtools.stack import free_port
from airflow_quota.store.engine import make_engine
from airflow_quota.store.models import Base
from airflow_quota.store.settings import normalize
from benchmarks.throwaway_postgres import NoPostgres, ThrowawayPostgres, fresh_database
from tests.conftest import missing

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


class Server(ThrowawayPostgres):
    """A PostgreSQL server of a test's own (initdb, pg_ctl), so it can be stopped and started
    again (``test_database_faults``, the trace replay under chaos); its binaries missing is a
    failure in CI (``missing``)."""

    def __init__(self) -> None:
        try:
            super().__init__()
        except NoPostgres as exc:
            missing(str(exc))


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
    with fresh_database(postgres_admin) as url:
        yield url


def continue_ids_after(url: str, last: int) -> None:
    """Every id sequence of the migrated quota database at ``url`` goes on after ``last``: the
    next row of each table with an id gets ``last + 1`` (ids beyond 32 bits, for the tests)."""
    engine = make_engine(normalize(url))
    try:
        with engine.begin() as connection:
            for table in Base.metadata.sorted_tables:
                if "id" in table.c and table.c.id.autoincrement is True:
                    sequence = f"pg_get_serial_sequence('{table.name}', 'id')"
                    connection.execute(text(f"SELECT setval({sequence}, {last})"))
    finally:
        engine.dispose()
