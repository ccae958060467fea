"""QuotaExecutor's Celery delegate end to end: a real Airflow 3.3 (scheduler, dag-processor,
api-server, PostgreSQL metadata) with ``[quota] executor_delegate = celery``, the local Redis as
the broker (a database of its own, emptied first), the metadata database as the result backend,
``airflow-quota scheduler``, and two Celery workers, one per instance type of the pool:
``airflow celery worker -q ml.g5.xlarge`` and ``-q ml.g4dn.xlarge``, one slot each.

1. Two quota tasks (``executor_dags/quota_exec_celery.py``) are placed, one on each type; each
   runs on the worker of its type's queue (that worker's log names the task's Celery task id, the
   other's does not), with its placement in its environment, and both end SUCCEEDED in Airflow
   and in the quota database.
2. Adoption: two tasks placed on ml.g5.xlarge, whose worker has one slot: one runs, the other's
   message waits in the broker. Airflow's scheduler is killed with SIGKILL and restarted; the new
   one adopts both, sends the waiting try again under the same Celery task id, and each task runs
   exactly once.

The broker is ``QUOTA_TEST_REDIS_URL`` (a Redis database of its own), else database 7 of the
machine's Redis at 127.0.0.1:6379 when one answers, else a throwaway ``redis-server`` (``make
test`` installs Debian's when absent); without any the test is skipped, or fails under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from airflow_quota.devtools.stack import BIN, AirflowStack, free_port
from airflow_quota.executors.celery_delegate import WORKER_CELERY_CONFIG
from tests.airflow.stacks import airflow_on_postgres
from tests.airflow.test_executor_end_to_end import HERE, events, final_jobs, tries, wait_until
from tests.conftest import missing

MACHINE_REDIS = "redis://127.0.0.1:6379/7"
QUEUES = {"g5": "ml.g5.xlarge", "g4dn": "ml.g4dn.xlarge"}
"""Each worker's name and the one queue it consumes: an instance type of ``quota.yaml``'s pool."""
DAG_ID = "quota_exec_celery"
ADOPT_DAG_ID = "quota_exec_celery_adopt"


def ready_line(af: AirflowStack, worker: str) -> bool:
    """Celery's worker logs ``ready.`` once it consumes its queue."""
    log = af.logs / f"celery-{worker}.log"
    return log.exists() and " ready." in log.read_text(errors="replace")


def answers(url: str) -> bool:
    try:
        with redis.Redis.from_url(url, socket_connect_timeout=3) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


@contextlib.contextmanager
def redis_broker(folder: Path) -> Iterator[str]:
    """A Redis database for the broker, emptied before and after: ``QUOTA_TEST_REDIS_URL``'s, the
    machine's, or a throwaway server's (no persistence) stopped at the end."""
    url = os.environ.get("QUOTA_TEST_REDIS_URL", MACHINE_REDIS)
    server = None
    if not answers(url) and "QUOTA_TEST_REDIS_URL" not in os.environ and shutil.which("redis-server"):
        port = free_port()
        server = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(folder)],
            stdout=subprocess.DEVNULL,
        )
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 30
        while not answers(url) and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
    if not answers(url):
        if server is not None:
            server.kill()
        missing(f"no Redis for the Celery broker at {url}")
    client = redis.Redis.from_url(url)
    client.flushdb()  # no message left by an earlier run
    try:
        yield url
    finally:
        client.flushdb()
        client.close()
        if server is not None:
            server.terminate()
            server.wait(timeout=30)


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowStack]:
    with (
        redis_broker(tmp_path_factory.mktemp("redis")) as broker_url,
        celery_stack(tmp_path_factory.mktemp("airflow-celery"), broker_url) as stack,
    ):
        yield stack


@contextlib.contextmanager
def celery_stack(root: Path, broker_url: str) -> Iterator[AirflowStack]:
    """The Airflow of this module, then its two Celery workers, ready."""
    with airflow_on_postgres(
        "celery",
        root,
        dags=[HERE / "quota_exec_training.py", HERE / "quota_exec_celery.py"],
        quota_config=HERE / "quota.yaml",
        components=("scheduler", "dag-processor", "api-server", "quota-scheduler"),
        wait_for_dags=(DAG_ID, ADOPT_DAG_ID),
        extra_env={
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor,quota:airflow_quota.executors.QuotaExecutor",
            "AIRFLOW__QUOTA__EXECUTOR_DELEGATE": "celery",
            "AIRFLOW__CELERY__BROKER_URL": broker_url,
            # the result backend is the celery provider's default: the metadata database (db+postgresql)
            "AIRFLOW__CELERY__EXTRA_CELERY_CONFIG": WORKER_CELERY_CONFIG,
            "AIRFLOW__CELERY__SYNC_PARALLELISM": "1",
            # a restarted scheduler adopts a dead one's tasks once its heartbeat is 10 s stale,
            # checked every 5 s (defaults: 30 s, 5 minutes)
            "AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_THRESHOLD": "10",
            "AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL": "5",
        },
    ) as stack:
        for worker, queue in QUEUES.items():
            stack.start_process(
                f"celery-{worker}",
                [
                    str(BIN / "airflow"),
                    "celery",
                    "worker",
                    "--queues",
                    queue,
                    "--concurrency",
                    "1",
                    "--celery-hostname",
                    f"{worker}@%h",
                    "--skip-serve-logs",  # the two would share the log server's port on one machine
                ],
            )
        for worker in QUEUES:
            wait_until(f"the {worker} Celery worker ready", lambda w=worker: ready_line(stack, w), stack, 90)
        yield stack


def test_each_placed_task_runs_on_the_celery_worker_of_its_instance_type(airflow: AirflowStack) -> None:
    af = airflow
    run = af.trigger(DAG_ID)
    states = af.wait_for_runs(DAG_ID, [run], 150)
    assert states[run] == "success", f"{tries(af, DAG_ID, run)}\n{af.tails(40)}"
    done = tries(af, DAG_ID, run)
    assert {t: (ti["state"], ti["try"]) for t, ti in done.items()} == dict.fromkeys(
        ("on_g5", "on_g4dn"), ("success", 1)
    ), done
    expected = dict.fromkeys(("on_g5", "on_g4dn"), ("SUCCEEDED", 1))
    wait_until("the quota jobs SUCCEEDED", lambda: final_jobs(af, DAG_ID) == expected, af, 15)

    # the placement reached the task on the worker's host, through the message's header
    started = {e["task"]: e for e in events(af) if e["event"] == "start"}
    assert {t: (started[t]["instance_type"], started[t]["share"]) for t in ("on_g5", "on_g4dn")} == {
        "on_g5": ("ml.g5.xlarge", "research"),
        "on_g4dn": ("ml.g4dn.xlarge", "lab"),
    }, started
    # each ran on the worker of its type's queue: Airflow recorded the Celery task id, which only
    # that worker's log names
    celery_ids = dict(af.query("SELECT task_id, external_executor_id FROM task_instance WHERE dag_id = :d", d=DAG_ID))
    assert all(celery_ids.values()), celery_ids
    logs = {w: (af.logs / f"celery-{w}.log").read_text(errors="replace") for w in QUEUES}
    ran_on = {task: sorted(w for w, log in logs.items() if celery_ids[task] in log) for task in celery_ids}
    assert ran_on == {"on_g5": ["g5"], "on_g4dn": ["g4dn"]}, (celery_ids, af.tails(30))
    print(f"\nCelery task ids {celery_ids}")


def test_a_scheduler_killed_while_a_celery_task_runs_and_one_waits_in_the_broker_runs_each_once(
    airflow: AirflowStack,
) -> None:
    af = airflow
    run = af.trigger(ADOPT_DAG_ID)

    def one_running_one_sent() -> bool:
        rows = af.query(
            "SELECT task_id, state, external_executor_id FROM task_instance WHERE dag_id = :d AND run_id = :r",
            d=ADOPT_DAG_ID,
            r=run,
        )
        states = {task: (state, celery_id) for task, state, celery_id in rows}
        started = any(e["task"] == "celery_first" and e["event"] == "start" for e in events(af))
        sent = states.get("waiting", (None, None))
        return started and states.get("first", ("", ""))[0] == "running" and sent[0] == "queued" and bool(sent[1])

    wait_until("first running, waiting sent to the queue", one_running_one_sent, af, 120)
    sent_as = af.query(
        "SELECT external_executor_id FROM task_instance WHERE dag_id = :d AND task_id = 'waiting'", d=ADOPT_DAG_ID
    )[0][0]
    old = af.processes["scheduler"]
    old_group = os.getpgid(old.pid)
    os.kill(old.pid, signal.SIGKILL)
    old.wait(timeout=30)
    af.start_process("scheduler", [str(BIN / "airflow"), "scheduler"])
    try:
        states = af.wait_for_runs(ADOPT_DAG_ID, [run], 150)
        assert states[run] == "success", f"{tries(af, ADOPT_DAG_ID, run)}\n{af.tails(40)}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(old_group, signal.SIGKILL)  # the dead scheduler's idle LocalExecutor workers
    done = tries(af, ADOPT_DAG_ID, run)
    assert {t: (ti["state"], ti["try"]) for t, ti in done.items()} == dict.fromkeys(
        ("first", "waiting"), ("success", 1)
    ), done
    expected = dict.fromkeys(("first", "waiting"), ("SUCCEEDED", 1))
    wait_until("the quota jobs SUCCEEDED", lambda: final_jobs(af, ADOPT_DAG_ID) == expected, af, 15)
    assert len(af.store.jobs(dag_id=ADOPT_DAG_ID)) == 2  # never submitted twice
    starts = [e["task"] for e in events(af) if e["event"] == "start" and e["task"].startswith("celery_")]
    assert sorted(starts) == ["celery_first", "celery_waiting"], starts  # each ran exactly once
    log = (af.logs / "scheduler.log").read_text(errors="replace")
    assert "QuotaExecutor adopted" in log
    # the waiting try kept its Celery task id: the g5 worker ran it under that id
    assert sent_as in (af.logs / "celery-g5.log").read_text(errors="replace")
