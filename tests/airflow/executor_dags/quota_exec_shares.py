"""Tasks of two shares on QuotaExecutor: ``@task`` and ``PythonOperator``, held while their share
is full and placed in the quota model's order (priority first).

``quota_exec_blocker`` fills the research share (one ml.g5.xlarge) for ``conf.seconds``;
``quota_exec_shares`` then queues three research tasks (priorities 1, 9, 5) and one prod task;
their Airflow ``priority_weight`` has Airflow queue r_low first, then r_mid, then r_high, so the
quota model's order (r_high, r_mid, r_low) overtakes r_low and r_mid: both starve.
"""

from __future__ import annotations

import pendulum
from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, task
from quota_exec_training import train

from airflow_quota.executors import quota_config

G5 = [{"instance_type": "ml.g5.xlarge", "count": 1}]
START = pendulum.datetime(2026, 1, 1, tz="UTC")

with DAG("quota_exec_blocker", schedule=None, start_date=START, catchup=False, params={"seconds": 95}):

    @task(executor="quota", executor_config=quota_config(share="research", instance_preferences=G5, priority=1))
    def block(params: dict[str, int] | None = None) -> int:
        return train("block", int((params or {}).get("seconds", 95)))

    block()

with DAG("quota_exec_shares", schedule=None, start_date=START, catchup=False):

    @task(
        executor="quota",
        priority_weight=30,
        executor_config=quota_config(share="research", instance_preferences=G5, priority=1),
    )
    def r_low() -> int:
        return train("r_low", 5)

    @task(
        executor="quota",
        queue="research",
        priority_weight=20,
        executor_config=quota_config(instance_preferences=G5, priority=5),
    )
    def r_mid() -> int:
        return train("r_mid", 5)

    r_high = PythonOperator(
        task_id="r_high",
        python_callable=train,
        op_args=["r_high", 5],
        executor="quota",
        executor_config=quota_config(share="research", instance_preferences=G5, priority=9),
    )
    p_now = PythonOperator(
        task_id="p_now",
        python_callable=train,
        op_args=["p_now", 5],
        executor="quota",
        executor_config=quota_config(share="prod", instance_preferences=G5),
    )
    r_low()
    r_mid()
