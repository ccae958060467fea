"""QuotaExecutor's Celery delegate end to end: a real Airflow 3.3 (scheduler, dag-processor,
api-server, PostgreSQL metadata) with ``[quota] executor_delegate = celery``, the local Redis as
the broker (a database of its own, emptied first), the metadata database as the result backend,
``airflow-quota scheduler``, and two Celery workers, one per instance type of the pool:
``airflow celery worker -q ml.g5.xlarge`` and ``-q ml.g4dn.xlarge``, one slot each.

Two quota tasks (``executor_dags/quota_exec_celery.py``) are placed, one on each type; each runs
on the worker of its type's queue (that worker's log names the task's Celery task id, the other's
does not), with its placement in its environment, and both end SUCCEEDED in Airflow and in the
quota database.

Redis is the one of ``QUOTA_TEST_REDIS_URL``'s server, else 127.0.0.1:6379; without it the test
is skipped, or fails under ``CI=true``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import redis

from airflow_quota.devtools.stack import BIN, AirflowStack
from airflow_quota.executors.celery_delegate import WORKER_CELERY_CONFIG
from tests.airflow.stacks import airflow_on_postgres
from tests.airflow.test_executor_end_to_end import HERE, events, final_jobs, tries, wait_until
from tests.conftest import missing

BROKER_URL = os.environ.get("QUOTA_TEST_REDIS_URL", "redis://127.0.0.1:6379/7")
QUEUES = {"g5": "ml.g5.xlarge", "g4dn": "ml.g4dn.xlarge"}
"""Each worker's name and the one queue it consumes: an instance type of ``quota.yaml``'s pool."""
DAG_ID = "quota_exec_celery"


def ready_line(af: AirflowStack, worker: str) -> bool:
    """Celery's worker logs ``ready.`` once it consumes its queue."""
    log = af.logs / f"celery-{worker}.log"
    return log.exists() and " ready." in log.read_text(errors="replace")


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowStack]:
    broker = redis.Redis.from_url(BROKER_URL, socket_connect_timeout=3)
    try:
        broker.ping()
    except redis.RedisError as exc:
        missing(f"no Redis for the Celery broker at {BROKER_URL}: {exc}")
    broker.flushdb()  # no message left by an earlier run
    with airflow_on_postgres(
        "celery",
        tmp_path_factory.mktemp("airflow-celery"),
        dags=[HERE / "quota_exec_training.py", HERE / "quota_exec_celery.py"],
        quota_config=HERE / "quota.yaml",
        components=("scheduler", "dag-processor", "api-server", "quota-scheduler"),
        wait_for_dags=(DAG_ID,),
        extra_env={
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor,quota:airflow_quota.executors.QuotaExecutor",
            "AIRFLOW__QUOTA__EXECUTOR_DELEGATE": "celery",
            "AIRFLOW__CELERY__BROKER_URL": BROKER_URL,
            # the result backend is the celery provider's default: the metadata database (db+postgresql)
            "AIRFLOW__CELERY__EXTRA_CELERY_CONFIG": WORKER_CELERY_CONFIG,
            "AIRFLOW__CELERY__SYNC_PARALLELISM": "1",
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
        try:
            yield stack
        finally:
            broker.flushdb()
            broker.close()


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
