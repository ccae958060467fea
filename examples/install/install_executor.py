"""The install page's plain ``@task`` on QuotaExecutor (docs/install.md, "Your first DAGs").

``executor="quota"`` makes the task a quota job of its share: it stays queued while the job
waits, then runs on an Airflow worker (QuotaExecutor's local delegate: the scheduler's host)
with its placement in ``Placement.current()``. It needs the hybrid executor setting
``LocalExecutor,quota:airflow_quota.executors.QuotaExecutor``: without it the file fails to
parse, naming the unknown executor.
"""

from __future__ import annotations

import os
from pathlib import Path

import pendulum
from airflow.sdk import DAG, task

from airflow_quota.executors import Placement, quota_config

CHECKPOINTS = Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser() / "checkpoints"
G5 = [{"instance_type": "ml.g5.xlarge", "count": 1}]

with DAG(
    dag_id="install_executor",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    tags=["airflow-quota"],
):

    @task(executor="quota", executor_config=quota_config(share="team-b", instance_preferences=G5, priority=3))
    def fine_tune() -> int:
        """Train on the instance the quota placed, from the checkpoint of an earlier attempt."""
        from tiny_training import train  # beside this file: the DAGs folder is on sys.path

        placement = Placement.current()
        print(f"placed on {placement.count}x {placement.instance_type} in share {placement.share}")
        checkpoint = Path(placement.checkpoint_uri or CHECKPOINTS / f"job-{placement.job_id}") / "step"
        return train(steps=10, step_seconds=0.1, checkpoint=checkpoint)

    fine_tune()
