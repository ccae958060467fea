"""QuotaExecutor's Celery delegate end to end: a real Airflow 3.3 (scheduler, dag-processor,
api-server, PostgreSQL metadata) with ``[quota] executor_delegate = celery``, the local Redis as
the broker (a database of its own, emptied first), the metadata database as the result backend,
``airflow-quota scheduler``, and two Celery workers, one per instance type of the pool:
``airflow celery worker -q ml.g5.xlarge`` (one slot) and ``-q ml.g4dn.xlarge`` (two slots: the
pool's two ml.g4dn.xlarge).

1. Two quota tasks (``executor_dags/quota_exec_celery.py``) are placed, one on each type; each
   runs on the worker of its type's queue (that worker's log names the task's Celery task id, the
   other's does not), with its placement in its environment, and both end SUCCEEDED in Airflow
   and in the quota database.
2. Adoption: two tasks placed on ml.g5.xlarge, whose worker has one slot: one runs, the other's
   message waits in the broker. Airflow's scheduler is killed with SIGKILL and restarted; the new
   one adopts both, sends the waiting try again under the same Celery task id, and each task runs
   exactly once.
3. Preemption on a worker: lab's low-priority task runs on ops's idle ml.g4dn.xlarge (borrowed);
   an ops task takes it back. The g4dn worker sends the borrower's task process SIGTERM at once
   (the executor's broadcast): it checkpoints while Airflow still has it RUNNING, keeps lab's
   ``preemption_grace_seconds`` (10 s) before it is cleared (RESTARTING), then its next try is held,
   placed after the ops task and resumes from its checkpoint; each task starts the expected number
   of times (the borrower twice, the others once) and the quota jobs agree.

The broker is ``QUOTA_TEST_REDIS_URL`` (a Redis database of its own), else database 7 of the
machine's Redis at 127.0.0.1:6379 when one answers, else a throwaway ``redis-server`` (``make
test`` installs Debian's when absent); without any the test is skipped, or fails under ``CI=true``.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from airflow_quota.devtools.stack import BIN, AirflowStack, free_port
from airflow_quota.executors.celery_delegate import WORKER_CELERY_CONFIG
from tests.airflow.stacks import (
    EXECUTOR_DAGS,
    airflow_on_postgres,
    connections_held_by,
    diagnosis,
    events,
    final_jobs,
    tries,
    wait_until,
)
from tests.conftest import missing

# Airflow's and the workers' start count towards the first test, and the reclaim test alone may
# wait 15 minutes at its deadlines: 25 minutes for each test (the default is 10, pyproject.toml).
pytestmark = pytest.mark.timeout(1500)

MACHINE_REDIS = "redis://127.0.0.1:6379/7"
QUEUES = {"g5": "ml.g5.xlarge", "g4dn": "ml.g4dn.xlarge"}
"""Each worker's name and the one queue it consumes: an instance type of ``quota.yaml``'s pool."""
SLOTS = {"g5": 1, "g4dn": 2}
"""Each worker's concurrency: ml.g4dn.xlarge runs lab's own task and the one it borrows at once."""
DAG_ID = "quota_exec_celery"
ADOPT_DAG_ID = "quota_exec_celery_adopt"
LAB_DAG_ID = "quota_exec_celery_lab"
OPS_DAG_ID = "quota_exec_celery_ops"


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
        dags=[EXECUTOR_DAGS / "quota_exec_training.py", EXECUTOR_DAGS / "quota_exec_celery.py"],
        quota_config=EXECUTOR_DAGS / "quota.yaml",
        # the pool's four instances: a task sent to a worker counts in the executor's slots, and the
        # reclaiming task is queued to the executor only while one is free
        parallelism=4,
        components=("scheduler", "dag-processor", "api-server", "quota-scheduler"),
        wait_for_dags=(DAG_ID, ADOPT_DAG_ID, LAB_DAG_ID, OPS_DAG_ID),
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
                    str(SLOTS[worker]),
                    "--celery-hostname",
                    f"{worker}@%h",
                    "--skip-serve-logs",  # the two would share the log server's port on one machine
                ],
            )
        for worker in QUEUES:
            wait_until(f"the {worker} Celery worker ready", functools.partial(ready_line, stack, worker), stack, 90)
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
    try:
        kept_open = connections_held_by(old_group)  # its workers live on, none of its sessions may
        assert kept_open == [], f"the killed scheduler's workers keep its database connections open: {kept_open}"
        af.start_process("scheduler", [str(BIN / "airflow"), "scheduler"])
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


def lab_grace() -> float:
    """The lab share's ``preemption_grace_seconds`` in the test's ``quota.yaml``."""
    shares = yaml.safe_load((EXECUTOR_DAGS / "quota.yaml").read_text())["shares"]
    return float(next(s for s in shares if s["name"] == "lab")["preemption_grace_seconds"])


def trail_and_logs(af: AirflowStack, lab: str, ops: str) -> str:
    """What went wrong: the runs, the quota jobs, the trainings' events and the logs' tails."""
    trail = "\n".join(str(e) for e in events(af))
    return f"{trail}\n{diagnosis(af, (LAB_DAG_ID, lab), (OPS_DAG_ID, ops))}"


def borrower_try(af: AirflowStack, run: str) -> tuple[str | None, int | None, str | None]:
    """The borrower's state, try number and task instance id (one try's) in Airflow's database."""
    rows = af.query(
        "SELECT state, try_number, CAST(id AS TEXT) FROM task_instance "
        "WHERE dag_id = :d AND run_id = :r AND task_id = 'borrower'",
        d=LAB_DAG_ID,
        r=run,
    )
    return (rows[0][0], rows[0][1], rows[0][2]) if rows else (None, None, None)


def test_a_task_preempted_on_a_celery_worker_gets_sigterm_and_the_shares_grace_then_resumes(
    airflow: AirflowStack,
) -> None:
    af = airflow
    grace = lab_grace()
    lab = af.trigger(LAB_DAG_ID)

    def both_running() -> bool:
        started = {e["task"] for e in events(af) if e["event"] == "start"}
        states = {t: ti["state"] for t, ti in tries(af, LAB_DAG_ID, lab).items()}
        return {"celery_lab_first", "celery_borrower"} <= started and states == dict.fromkeys(
            ("lab_first", "borrower"), "running"
        )

    wait_until("both lab tasks running on the g4dn worker (one on ops's instance)", both_running, af, 180)
    step = Path(af.env["AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS"]) / "celery_borrower" / "step"
    wait_until("the borrower 5 steps in", lambda: step.exists() and int(step.read_text() or 0) >= 5, af, 60)
    state, first_try, first_ti_id = borrower_try(af, lab)
    assert (state, first_try) == ("running", 1), (state, first_try)
    ops = af.trigger(OPS_DAG_ID)

    # the SIGTERM reaches the task while Airflow still has it RUNNING: its checkpoint comes first
    def checkpointed() -> dict[str, Any] | None:
        return next((e for e in events(af) if e["task"] == "celery_borrower" and e["event"] == "checkpoint"), None)

    deadline = time.monotonic() + 120
    while (checkpoint := checkpointed()) is None:
        if time.monotonic() > deadline or af.dead():
            pytest.fail(f"no checkpoint from the preempted borrower\n{trail_and_logs(af, lab, ops)}")
        time.sleep(0.2)
    at_checkpoint = borrower_try(af, lab)
    assert at_checkpoint[:2] == ("running", 1), (
        f"the borrower checkpointed only once Airflow had it {at_checkpoint[0]}: no SIGTERM before the clear"
    )
    # then it keeps running for the share's grace before Airflow's RESTARTING route stops it
    deadline = time.monotonic() + grace + 60
    while borrower_try(af, lab)[:2] == ("running", 1):
        if time.monotonic() > deadline or af.dead():
            pytest.fail(f"the borrower was never stopped\n{trail_and_logs(af, lab, ops)}")
        time.sleep(0.2)
    kept = time.time() - checkpoint["at"]
    assert kept >= grace - 2, f"cleared {kept:.1f} s after its SIGTERM; the grace is {grace:.0f} s"

    states = af.wait_for_runs(LAB_DAG_ID, [lab], 420)
    assert states[lab] == "success", trail_and_logs(af, lab, ops)
    assert af.wait_for_runs(OPS_DAG_ID, [ops], 120)[ops] == "success", trail_and_logs(af, lab, ops)
    done = {**tries(af, LAB_DAG_ID, lab), **tries(af, OPS_DAG_ID, ops)}
    assert {t: (ti["state"], ti["try"]) for t, ti in done.items()} == {
        "lab_first": ("success", 1),
        "borrower": ("success", 2),  # the RESTARTING route: the next try, no retry used
        "reclaim": ("success", 1),
    }, done
    expected = {"lab_first": ("SUCCEEDED", 1), "borrower": ("SUCCEEDED", 2)}
    wait_until("the lab quota jobs SUCCEEDED", lambda: final_jobs(af, LAB_DAG_ID) == expected, af, 15)
    assert final_jobs(af, OPS_DAG_ID) == {"reclaim": ("SUCCEEDED", 1)}
    jobs = {j.task_id: j for j in af.store.jobs(dag_id=LAB_DAG_ID)}
    assert jobs["borrower"].preemptions == 1, jobs["borrower"]
    preempted = [e for e in af.store.events(job_id=jobs["borrower"].id) if e.type == "PREEMPTED"]
    assert [e.record["kind"] for e in preempted] == ["CROSS_SHARE"], preempted

    # each task started as often as expected: the borrower twice (resumed on attempt 2), the others once
    trail = [e for e in events(af) if e["task"].startswith("celery_") and e["task"] != "celery_first"]
    starts = [(e["task"], e["attempt"]) for e in trail if e["event"] == "start" and e["task"] != "celery_waiting"]
    assert sorted(starts) == [
        ("celery_borrower", 1),
        ("celery_borrower", 2),
        ("celery_lab_first", 1),
        ("celery_ops", 1),
    ], starts
    borrower = [e for e in trail if e["task"] == "celery_borrower"]
    assert [e["event"] for e in borrower] == ["start", "checkpoint", "start", "end"], borrower
    assert borrower[2]["resumed_from"] == checkpoint["step"] >= 5, borrower
    ops_start = next(e for e in trail if e["task"] == "celery_ops" and e["event"] == "start")
    assert ops_start["instance_type"] == "ml.g4dn.xlarge" and ops_start["at"] > checkpoint["at"], ops_start
    # the g4dn worker signalled the borrower's first try; the scheduler asked for it through the workers
    worker_log = (af.logs / "celery-g4dn.log").read_text(errors="replace")
    assert "SIGTERM to the task process" in worker_log and first_ti_id in worker_log, af.tails(30)
    assert first_ti_id not in (af.logs / "celery-g5.log").read_text(errors="replace")
    assert "SIGTERM through the workers" in (af.logs / "scheduler.log").read_text(errors="replace")
    print(f"\nborrower: SIGTERM, checkpoint at step {checkpoint['step']}, cleared {kept:.1f} s later, resumed")
