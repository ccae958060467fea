"""The end-to-end lineage DAG (``tests/airflow/test_lineage.py``): a training that waits, and
one submitted without waiting whose end a ``QuotaJobSensor`` waits for, both deferred."""

from __future__ import annotations

import sys

import pendulum
from airflow.sdk import DAG

from airflow_quota.operators import QuotaTrainingOperator
from airflow_quota.sensors import QuotaJobSensor

# One second: the job ends within seconds of the task's deferral, which Airflow 3.3's scheduler
# met with a failed resumed task until the trigger waited for it (DEFER_SETTLE_SECONDS)
TRAINING = "import time; print('epoch 1', flush=True); time.sleep(1); print('the last line', flush=True)"

with DAG(dag_id="quota_lineage", schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC")):
    QuotaTrainingOperator(
        task_id="train",
        share="qs1",
        instance_preferences=[{"instance_type": "ml.g5.xlarge", "count": 1}],
        backend="local",
        command=[sys.executable, "-c", TRAINING],
        checkpoint_uri="/tmp/quota-lineage-checkpoints/{{ run_id | replace(':', '-') }}",
        check_interval=1.0,
    )
    submit = QuotaTrainingOperator(
        task_id="submit",
        share="qs2",
        instance_preferences=[{"instance_type": "ml.g5.xlarge", "count": 1}],
        backend="local",
        command=[sys.executable, "-c", "print('trained')"],
        wait_for_completion=False,
    )
    submit >> QuotaJobSensor(task_id="wait", job_id=submit.output, poke_interval=1.0, max_attempts=300)
