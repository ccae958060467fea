"""The AWS quota-management walkthrough as an Airflow DAG: three shares, five training tasks.

It expects the quota of ``examples/quota.yaml`` (a pool of three ``ml.g5.xlarge``; shares
``qs1`` LEND_AND_BORROW with in-share preemption, ``qs2`` LEND, ``qs3`` RESERVE, one instance
each) and the quota scheduler running with the local backend::

    airflow-quota apply examples/quota.yaml
    airflow-quota scheduler

Every training task is a ``QuotaTrainingOperator`` running ``train_script.py`` (next to this
file) on the local backend. The walkthrough's clock is scaled down: one second here is
``SCALE`` seconds of the walkthrough, so its 7,200-second trainings take 144 s and its
checkpoints (every 300 s) fall every 6 s. What happens, as the task logs and
``airflow-quota jobs show`` tell it:

1. t=0: ``qs1_high``, ``qs1_med`` and ``qs1_low`` (priorities 3, 2, 1) are submitted to qs1,
   in this order (``then_qs1_med`` and ``then_qs1_low`` space them ``ORDER_GAP`` seconds apart).
   qs1_high runs within qs1's limit; qs1_med **borrows** qs2's idle instance; qs1_low waits,
   since qs3 is RESERVE and lends nothing.
2. t=600: ``qs2_job`` arrives (``at_600s`` waits until then). qs2 is under its limit, so it
   **reclaims** its instance: qs1_med is preempted (CROSS_SHARE), requeued with its checkpoint.
3. t=900: ``qs3_job`` starts at once on the instance nobody could borrow.
4. t=1200: ``raise_qs1_low`` raises qs1_low to priority 4 through ``QuotaHook.set_priority``
   (it finds the job by the XCom ``quota_job_id`` the operator pushed when it submitted). With
   in-share preemption qs1_low preempts qs1_high (IN_SHARE).
5. Everything finishes; the preempted trainings print ``resumed from step N``.

The ``at_…`` and ``then_…`` tasks only sleep (in a worker slot, briefly); the training tasks
wait deferred, in the triggerer, holding no worker slot however long they are queued or
preempted.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from airflow.sdk import DAG, get_current_context, task

from airflow_quota.exceptions import ChangeRefused
from airflow_quota.hooks.quota import QuotaHook
from airflow_quota.operators import QuotaTrainingOperator

TRAIN_SCRIPT = str(Path(__file__).resolve().with_name("train_script.py"))
CHECKPOINTS = os.environ.get(
    "AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS", os.path.join(tempfile.gettempdir(), "airflow-quota-checkpoints")
)
QUOTA_CONN_ID = "quota_default"
G5 = [{"instance_type": "ml.g5.xlarge", "count": 1}]

SCALE = 50
"""Seconds of the walkthrough per second of this DAG."""
STEP_SECONDS = 0.5
TRAINING_STEPS = int(7200 / SCALE / STEP_SECONDS)
CHECKPOINT_EVERY = int(300 / SCALE / STEP_SECONDS)
ORDER_GAP = 3
"""Seconds between the three submissions of t=0, to keep their order."""


def training(task_id: str, share: str, priority: int, checkpoints: bool = True) -> QuotaTrainingOperator:
    """One of the walkthrough's trainings: one ml.g5.xlarge, 7,200 walkthrough seconds of work."""
    command = [sys.executable, TRAIN_SCRIPT, "--steps", str(TRAINING_STEPS), "--step-seconds", str(STEP_SECONDS)]
    command += ["--checkpoint-every", str(CHECKPOINT_EVERY)]
    return QuotaTrainingOperator(
        task_id=task_id,
        share=share,
        priority=priority,
        instance_preferences=G5,
        backend="local",
        command=command,
        # one directory per DAG, run and task: a resumed attempt (or an Airflow retry) finds it
        checkpoint_uri=CHECKPOINTS + "/{{ dag.dag_id }}/{{ run_id | replace(':', '-') }}/{{ task.task_id }}",
        checkpoint_interval=CHECKPOINT_EVERY * STEP_SECONDS if checkpoints else None,
        quota_conn_id=QUOTA_CONN_ID,
        poll_interval=2.0,
    )


@task
def wait_until(walkthrough_seconds: int) -> None:
    """Sleep until ``walkthrough_seconds`` (scaled) after the run started."""
    dag_run = get_current_context()["dag_run"]
    started = dag_run.start_date or datetime.now(timezone.utc)
    due = started.timestamp() + walkthrough_seconds / SCALE
    time.sleep(max(0.0, due - time.time()))


@task
def raise_qs1_low(priority: int = 4) -> None:
    """Raise qs1_low's priority, as the walkthrough's ``UpdateServiceJob`` does."""
    ti = get_current_context()["ti"]
    job_id = ti.xcom_pull(task_ids="qs1_low", key="quota_job_id")
    if job_id is None:
        print("qs1_low has not submitted its quota job yet: nothing to raise")
        return
    try:
        QuotaHook(QUOTA_CONN_ID).set_priority(int(job_id), priority)
    except ChangeRefused as exc:  # e.g. the job already finished
        print(f"quota job {job_id} keeps its priority: {exc}")
        return
    print(f"asked the quota scheduler to raise quota job {job_id} (qs1_low) to priority {priority}")


with DAG(
    dag_id="quota_walkthrough",
    description="The AWS quota-management walkthrough: borrow, reclaim, RESERVE, in-share preemption",
    schedule=None,
    start_date=datetime(2026, 11, 1, tzinfo=timezone.utc),
    catchup=False,
    tags=["airflow-quota", "example"],
):
    # t=0: three jobs in qs1, in the walkthrough's order: a few seconds apart, so that the quota
    # scheduler (which runs a cycle at each submission) takes them in this order
    training("qs1_high", "qs1", priority=3)
    wait_until.override(task_id="then_qs1_med")(ORDER_GAP * SCALE) >> training("qs1_med", "qs1", priority=2)
    wait_until.override(task_id="then_qs1_low")(2 * ORDER_GAP * SCALE) >> training("qs1_low", "qs1", priority=1)
    # t=600 and t=900: qs2 and qs3 submit (their jobs have no checkpoints: they are never preempted)
    wait_until.override(task_id="at_600s")(600) >> training("qs2_job", "qs2", priority=1, checkpoints=False)
    wait_until.override(task_id="at_900s")(900) >> training("qs3_job", "qs3", priority=1, checkpoints=False)
    # t=1200: qs1_low is raised above qs1_high
    wait_until.override(task_id="at_1200s")(1200) >> raise_qs1_low()
