"""Quota tasks the Celery delegate runs. ``quota_exec_celery``: one placed on ml.g5.xlarge (the
research share's), one on ml.g4dn.xlarge (the lab share's), each sent to the Celery queue of its
instance type. ``quota_exec_celery_adopt``: two on ml.g5.xlarge, for a scheduler restart while
one runs and the other waits in the broker. ``quota_exec_celery_lab`` and ``quota_exec_celery_ops``:
a preemption on a worker (a cross-share reclaim of a borrowed ml.g4dn.xlarge)."""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG, task
from quota_exec_training import train

from airflow_quota.executors import quota_config

G5 = [{"instance_type": "ml.g5.xlarge", "count": 1}]
G4 = [{"instance_type": "ml.g4dn.xlarge", "count": 1}]

with DAG("quota_exec_celery", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):

    @task(executor="quota", executor_config=quota_config(share="research", instance_preferences=G5))
    def on_g5() -> int:
        return train("on_g5", 2)

    @task(executor="quota", executor_config=quota_config(share="lab", instance_preferences=G4))
    def on_g4dn() -> int:
        return train("on_g4dn", 2)

    on_g5()
    on_g4dn()

with DAG("quota_exec_celery_adopt", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):
    # both placed at once on ml.g5.xlarge (one share's instance each); the queue's one worker slot
    # runs one while the other's message waits in the broker

    @task(executor="quota", executor_config=quota_config(share="research", instance_preferences=G5))
    def first() -> int:
        return train("celery_first", 30)

    @task(executor="quota", executor_config=quota_config(share="prod", instance_preferences=G5))
    def waiting() -> int:
        return train("celery_waiting", 2)

    first()
    waiting()

# a cross-share reclaim on the Celery workers: lab borrows ops's idle ml.g4dn.xlarge for its
# low-priority celery_borrower while celery_lab_first holds lab's own; celery_ops takes ops's
# instance back, the borrower gets SIGTERM on its worker, lab's 10 s grace, and resumes later
G4_CHECKPOINTS = os.environ.get("AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS", "/tmp/quota-checkpoints")

with DAG("quota_exec_celery_lab", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):

    @task(executor="quota", executor_config=quota_config(share="lab", instance_preferences=G4, priority=5))
    def lab_first() -> int:
        return train("celery_lab_first", 60)

    @task(
        executor="quota",
        executor_config=quota_config(
            share="lab", instance_preferences=G4, priority=1, checkpoint_uri=f"{G4_CHECKPOINTS}/celery_borrower"
        ),
    )
    def borrower() -> int:
        return train("celery_borrower", 40)

    lab_first()
    borrower()

with DAG("quota_exec_celery_ops", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):

    @task(executor="quota", executor_config=quota_config(share="ops", instance_preferences=G4))
    def reclaim() -> int:
        return train("celery_ops", 10)

    reclaim()
