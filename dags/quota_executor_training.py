"""Training as plain Airflow tasks under the quota shares: QuotaExecutor.

Needs the hybrid executor setting (``make demo`` and the test stack set it)::

    [core]
    executor = LocalExecutor,quota:airflow_quota.executors.QuotaExecutor

Each task with ``executor="quota"`` becomes a quota job of its share: it stays QUEUED while the
job waits (for hours if it must), then runs on an Airflow worker with its placement in the
environment (``Placement.current()``). ``on_preemption`` saves a checkpoint when the share takes
the instances back; the next try resumes from it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pendulum
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, task

from airflow_quota.executors import Placement, on_preemption, quota_config

CHECKPOINTS = Path(os.environ.get("AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS", "/tmp/airflow-quota-checkpoints"))
G5 = [{"instance_type": "ml.g5.xlarge", "count": 1}]


def train(steps: int = 30) -> int:
    """A training loop that checkpoints each step and resumes from its checkpoint."""
    placement = Placement.current()
    folder = Path(placement.checkpoint_uri or CHECKPOINTS / str(placement.job_id))
    folder.mkdir(parents=True, exist_ok=True)
    checkpoint = folder / "step"
    step = int(checkpoint.read_text()) if checkpoint.exists() else 0
    on_preemption(lambda: checkpoint.write_text(str(step)))
    print(f"on {placement.count}x {placement.instance_type} in {placement.share}, attempt {placement.attempt}")
    while step < steps:
        time.sleep(1)  # one step of training
        step += 1
        checkpoint.write_text(str(step))
    return step


with DAG(
    "quota_executor_training",
    schedule=None,
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    default_args={"executor": "quota"},
):

    @task(
        executor_config=quota_config(
            share="qs1", instance_preferences=G5, priority=2, checkpoint_uri=str(CHECKPOINTS / "encoder")
        )
    )
    def train_encoder() -> int:
        return train()

    evaluate = PythonOperator(
        task_id="evaluate",
        python_callable=train,
        op_kwargs={"steps": 5},
        queue="qs2",  # the queue names the share
        executor_config=quota_config(instance_preferences=G5),
    )
    train_encoder() >> evaluate
