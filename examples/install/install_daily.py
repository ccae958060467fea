"""The install page's daily training, to backfill with another priority (docs/install.md).

``params=quota_priority_param()`` lets a run's conf carry ``quota_priority``: every
``QuotaTrainingOperator`` of that run then submits with it instead of its own ``priority``.
Re-training two past days ahead of the teams' other work::

    airflow backfill create --dag-id install_daily --from-date 2026-11-01 --to-date 2026-11-02 \\
        --dag-run-conf '{"quota_priority": 900}'
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_quota.operators import QuotaTrainingOperator, quota_priority_param

TRAINING = str(Path(__file__).resolve().with_name("tiny_training.py"))
CHECKPOINTS = Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser() / "checkpoints"

with DAG(
    dag_id="install_daily",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    params=quota_priority_param(),  # the one line that lets a run override the priority
    tags=["airflow-quota"],
):
    QuotaTrainingOperator(
        task_id="train",
        share="team-a",
        priority=1,  # background work; a backfill's quota_priority replaces it
        instance_preferences=[{"instance_type": "ml.g5.xlarge", "count": 1}],
        max_pending_time=timedelta(hours=6),
        backend="local",
        command=[sys.executable, TRAINING, "--steps", "10", "--step-seconds", "0.2"],
        env={"TRAINING_DATE": "{{ ds }}"},
        checkpoint_uri=str(CHECKPOINTS) + "/{{ dag.dag_id }}/{{ run_id | replace(':', '-') }}",
        checkpoint_interval=1,
        poll_interval=2.0,
    )
