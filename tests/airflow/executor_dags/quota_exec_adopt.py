"""Three research tasks, one running and two held when the test kills Airflow's scheduler with
SIGKILL; the restarted scheduler's QuotaExecutor adopts them all."""

from __future__ import annotations

import pendulum
from airflow.sdk import DAG, task
from quota_exec_training import train

from airflow_quota.executors import quota_config

G5 = [{"instance_type": "ml.g5.xlarge", "count": 1}]

with DAG("quota_exec_adopt", schedule=None, start_date=pendulum.datetime(2026, 1, 1, tz="UTC"), catchup=False):

    @task(executor="quota", executor_config=quota_config(share="research", instance_preferences=G5, priority=9))
    def a_first() -> int:
        return train("a_first", 40)

    @task(executor="quota", executor_config=quota_config(share="research", instance_preferences=G5, priority=5))
    def a_second() -> int:
        return train("a_second", 5)

    @task(executor="quota", executor_config=quota_config(share="research", instance_preferences=G5, priority=1))
    def a_third() -> int:
        return train("a_third", 5)

    a_first()
    a_second()
    a_third()
