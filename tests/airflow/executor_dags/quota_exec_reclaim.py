"""A cross-share reclaim of a running task: lab borrows ops's idle ml.g4dn.xlarge, then an ops
task takes it back; the lab task on it gets SIGTERM, checkpoints, is stopped through Airflow's
RESTARTING route and resumes from its checkpoint on its next try."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, task
from quota_exec_training import train

from airflow_quota.executors import quota_config

G4 = [{"instance_type": "ml.g4dn.xlarge", "count": 1}]
START = pendulum.datetime(2026, 1, 1, tz="UTC")
CHECKPOINTS = os.environ.get("AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS", "/tmp/quota-checkpoints")

with DAG("quota_exec_lab", schedule=None, start_date=START, catchup=False):

    @task(executor="quota", executor_config=quota_config(share="lab", instance_preferences=G4, priority=5))
    def lab_first() -> int:
        return train("lab_first", 50)

    @task(
        executor="quota",
        executor_config=quota_config(
            share="lab", instance_preferences=G4, priority=1, checkpoint_uri=f"{CHECKPOINTS}/lab_borrower"
        ),
    )
    def lab_borrower() -> int:
        return train("lab_borrower", 40)

    lab_first()
    lab_borrower()

with DAG("quota_exec_ops", schedule=None, start_date=START, catchup=False):

    @task(executor="quota", executor_config=quota_config(share="ops", instance_preferences=G4))
    def ops_job() -> int:
        return train("ops_job", 10)

    ops_job()
