"""A real Airflow 3.3 for end-to-end tests (``devtools.stack.AirflowStack``) on two fresh
PostgreSQL databases, its metadata and the quota database, dropped when it stops.

The PostgreSQL server is the one of ``QUOTA_TEST_POSTGRES_URL`` (an admin URL), else
127.0.0.1:5432; without one the test is skipped, or fails under ``CI=true``.

Below it, what the QuotaExecutor end-to-end tests (``test_executor_end_to_end``,
``test_executor_celery_end_to_end``) read from a running stack and the DAGs they share
(``executor_dags/``).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psutil
import psycopg
import pytest

from airflow_quota.devtools.stack import AirflowStack, StackSettings
from tests.conftest import missing
from tests.waiting import wait_for

EXECUTOR_DAGS = Path(__file__).resolve().parent / "executor_dags"
"""The QuotaExecutor end-to-end tests' DAGs, their training and ``quota.yaml``."""
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


# -- reading a running stack ---------------------------------------------------------------


def events(af: AirflowStack) -> list[dict[str, Any]]:
    """What the trainings recorded (``quota_exec_training.py``), in order."""
    path = Path(af.env["AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS"]) / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_until(what: str, condition: Callable[[], object], af: AirflowStack, timeout: float) -> None:
    """Poll ``condition`` every second until it holds; fail at once when an Airflow process has
    died, and with the logs' tails at the deadline."""

    def alive() -> None:
        if af.dead():
            pytest.fail(f"Airflow processes died while waiting for {what}: {af.dead()}\n{af.tails()}")

    wait_for(condition, timeout, lambda: f"{what}\n{af.tails(40)}", interval=1.0, check=alive)


def tries(af: AirflowStack, dag_id: str, run_id: str) -> dict[str, dict[str, Any]]:
    """Per task: its state, try number and when it was queued, started and ended."""
    rows = af.query(
        "SELECT task_id, state, try_number, queued_dttm, start_date, end_date FROM task_instance "
        "WHERE dag_id = :d AND run_id = :r",
        d=dag_id,
        r=run_id,
    )
    return {r[0]: {"state": r[1], "try": r[2], "queued": r[3], "start": r[4], "end": r[5]} for r in rows}


def connections_held_by(group: int) -> list[str]:
    """The open connections to the PostgreSQL server that processes of process group ``group``
    hold, one "pid name: local port" each. A killed scheduler's surviving workers must hold
    none: a connection they kept open would keep the scheduler's session, and the row locks of
    a transaction it was in, alive (``airflow_quota/executors/forking.py``)."""
    server_port = urlsplit(ADMIN_URL).port or 5432
    held = []
    for process in psutil.process_iter(["name"]):
        try:
            if os.getpgid(process.pid) != group:
                continue
            held += [
                f"{process.pid} {process.info['name']}: {c.laddr.port}"
                for c in process.net_connections(kind="tcp")
                if c.raddr and c.raddr.port == server_port and c.status == psutil.CONN_ESTABLISHED
            ]
        except (ProcessLookupError, psutil.NoSuchProcess, psutil.ZombieProcess):
            continue  # ended meanwhile
    return held


def diagnosis(af: AirflowStack, *runs: tuple[str, str]) -> str:
    """The runs' task instances, every quota job and the logs' tails, for a failure message."""
    lines = [f"{dag}/{run}: {af.run_state(dag, run)} {tries(af, dag, run)}" for dag, run in runs]
    lines += [f"quota job {j.id} {j.task_id} {j.state} {j.reason or ''} {j.detail or ''}" for j in af.store.jobs()]
    return "\n".join(lines) + "\n" + af.tails(30)


def final_jobs(af: AirflowStack, dag_id: str) -> dict[str | None, tuple[str, int]]:
    """Per task: its quota job's state and number of attempts."""
    return {j.task_id: (j.state, j.attempts) for j in af.store.jobs(dag_id=dag_id)}
