"""A real Airflow 3.3 for end-to-end tests (``devtools.stack.AirflowStack``) on two fresh
PostgreSQL databases, its metadata and the quota database, dropped when it stops.

The PostgreSQL server is the one of ``QUOTA_TEST_POSTGRES_URL`` (an admin URL), else
127.0.0.1:5432; without one the test is skipped, or fails under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

from airflow_quota.devtools.stack import AirflowStack, StackSettings
from tests.conftest import missing

ADMIN_URL = os.environ.get("QUOTA_TEST_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


@contextlib.contextmanager
def airflow_on_postgres(name: str, root: Path, **settings: Any) -> Iterator[AirflowStack]:
    """The stack of ``settings`` (``StackSettings`` fields but the two URLs), started and ready."""
    try:
        with psycopg.connect(ADMIN_URL, connect_timeout=3):
            pass
    except psycopg.Error as exc:
        missing(f"no PostgreSQL server for the metadata database at {ADMIN_URL}: {exc}")
    suffix = uuid.uuid4().hex[:10]
    names = {"metadata": f"airflow_{name}_{suffix}", "quota": f"quota_{name}_{suffix}"}
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        for database in names.values():
            admin.execute(f'CREATE DATABASE "{database}"')
    base = ADMIN_URL.rsplit("/", 1)[0]
    stack_settings = StackSettings(
        root=root, metadata_url=f"{base}/{names['metadata']}", quota_url=f"{base}/{names['quota']}", **settings
    )
    started = time.monotonic()
    try:
        with AirflowStack(stack_settings) as stack:
            print(f"\nAirflow 3.3 ready in {time.monotonic() - started:.0f} s (AIRFLOW_HOME {stack.home})")
            yield stack
    finally:
        with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
            for database in names.values():
                admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
