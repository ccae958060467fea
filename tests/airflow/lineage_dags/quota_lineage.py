"""The end-to-end lineage DAG (``tests/airflow/test_lineage.py``): a training that waits, and
one submitted without waiting whose end a ``QuotaJobSensor`` waits for, both deferred."""

from __future__ import annotations

import sys

import pendulum
from airflow.sdk import DAG

from airflow_quota.operators import QuotaTrainingOperator
from airflow_quota.sensors import QuotaJobSensor

# Ten seconds: a trigger that fires within a second or two of the deferral can meet the deferring
# try's own end in Airflow 3.3 (the resumed task found already failed: "Cannot start Task Instance
# in invalid state"), seen here with a one-second training.
TRAINING = "import time; print('epoch 1', flush=True); time.sleep(10); print('the last line', flush=True)"

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
