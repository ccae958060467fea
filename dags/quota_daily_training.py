"""A daily training DAG whose runs can be given another priority: backfill with an override.

Two trainings a day in share ``qs1`` of ``examples/quota.yaml`` (low priority: background work
that borrows when the pool is idle and yields when its owners need it), then a report from
their summaries in XCom. Run it with the quota scheduler and the local backend::

    airflow-quota apply examples/quota.yaml
    airflow-quota scheduler

**Priority override.** The DAG declares ``params=quota_priority_param()``: every run may carry
``quota_priority`` in its conf, and every ``QuotaTrainingOperator`` of that run then submits
with that priority instead of its own. Re-training three past days urgently::

    airflow backfill create --dag-id quota_daily_training \\
        --from-date 2026-11-01 --to-date 2026-11-03 --dag-run-conf '{"quota_priority": 9000}'

Airflow checks the conf against the Param (an integer 0-9999, or null) when it creates the
runs; a value above the share's ``max_priority`` fails the training tasks with the quota's
message, and nothing is submitted. The task log says where the priority came from::

    submitted as quota job 7 to share qs1 (quota_daily_training-train_ranker-…, priority 9000 (run conf override))

The same works for a manual run (``airflow dags trigger quota_daily_training --conf
'{"quota_priority": 9000}'``, or the trigger form, which offers the field).

``catchup=False``: the scheduler runs only the latest day; older days are a backfill's job.
"""

from __future__ import annotations

import os
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, get_current_context, task

from airflow_quota.operators import QuotaTrainingOperator, quota_priority_param

TRAIN_SCRIPT = str(Path(__file__).resolve().with_name("train_script.py"))
CHECKPOINTS = os.environ.get(
    "AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS", os.path.join(tempfile.gettempdir(), "airflow-quota-checkpoints")
)
CHECKPOINT_URI = CHECKPOINTS + "/{{ dag.dag_id }}/{{ run_id | replace(':', '-') }}/{{ task.task_id }}"
"""One checkpoint directory per DAG, run and task (templated): a resumed attempt finds it."""


@task
def report() -> None:
    """Print what each training used, from the summary its task returned to XCom."""
    ti = get_current_context()["ti"]
    for name in ("train_encoder", "train_ranker"):
        s: dict[str, Any] = ti.xcom_pull(task_ids=name)
        print(
            f"{name}: quota job {s['job_id']} {s['state']} on {s['instance_count']}x {s['instance_type']}"
            f" (borrowed {s['borrowed']}), {s['attempts']} attempt(s), {s['preemptions']} preemption(s),"
            f" {s['gpu_hours']:.4f} GPU-hours ({s['lost_gpu_hours']:.4f} lost), ${s['cost']:.4f},"
            f" waited {s['wait_seconds']:.0f} s"
        )


with DAG(
    dag_id="quota_daily_training",
    description="Daily trainings in share qs1; backfill with --dag-run-conf '{\"quota_priority\": N}'",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    params=quota_priority_param(),  # the one line that enables the override
    default_args={"retries": 1, "retry_delay": timedelta(seconds=30)},
    tags=["airflow-quota", "example"],
):
    trainings = {
        name: QuotaTrainingOperator(
            task_id=f"train_{name}",
            share="qs1",
            priority=priority,  # each task's own; a run's quota_priority replaces it
            instance_preferences=[{"instance_type": "ml.g5.xlarge", "count": 1}],
            max_pending_time=timedelta(hours=6),  # the day's model is useless later than that
            backend="local",
            command=[sys.executable, TRAIN_SCRIPT, "--steps", str(steps), "--step-seconds", "0.05"],
            env={"TRAINING_DATE": "{{ ds }}"},
            checkpoint_uri=CHECKPOINT_URI,
            checkpoint_interval=0.5,  # --checkpoint-every 10 steps of 0.05 s
            preemption_retries=5,
            retry_attempts=2,
            quota_conn_id="quota_default",
            check_interval=2.0,
        )
        for name, priority, steps in (("encoder", 2, 40), ("ranker", 1, 30))
    }
    list(trainings.values()) >> report()
