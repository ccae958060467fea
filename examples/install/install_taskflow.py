"""The install page's first DAG: a TaskFlow ``@task`` decides the share and priority, and
``QuotaTrainingOperator`` takes them as its arguments (docs/install.md, "Your first DAGs").

The training (``tiny_training.py``, beside this file in the DAGs folder) runs on the quota
scheduler's local backend: on the machine of ``airflow-quota scheduler``, which must see this
file's folder. The task waits deferred in the triggerer, holding no worker slot, and returns
the quota job's summary to XCom, which ``report`` prints.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, task

from airflow_quota.operators import QuotaTrainingOperator

TRAINING = str(Path(__file__).resolve().with_name("tiny_training.py"))
CHECKPOINTS = Path(os.environ.get("AIRFLOW_HOME", "~/airflow")).expanduser() / "checkpoints"
G5 = [{"instance_type": "ml.g5.xlarge", "count": 1}]


@task
def choose(**context: Any) -> dict[str, Any]:
    """Where to train and how urgently: here fixed, in your DAG from the data or the run's conf."""
    return {"share": "team-a", "priority": 5}


@task
def report(summary: dict[str, Any]) -> str:
    """The training's summary from XCom: where it ran and how long it waited."""
    line = (
        f"quota job {summary['job_id']} {summary['state']} on {summary['instance_count']}x "
        f"{summary['instance_type']} in share {summary['share']}, waited {summary['wait_seconds']:.0f} s"
    )
    print(line)
    return line


with DAG(
    dag_id="install_taskflow",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    tags=["airflow-quota"],
):
    decided = choose()
    train = QuotaTrainingOperator(
        task_id="train",
        share=decided["share"],
        priority=decided["priority"],
        instance_preferences=G5,
        backend="local",
        command=[sys.executable, TRAINING, "--steps", "10", "--step-seconds", "0.2"],
        checkpoint_uri=str(CHECKPOINTS) + "/{{ dag.dag_id }}/{{ run_id | replace(':', '-') }}",
        checkpoint_interval=1,
        poll_interval=2.0,
    )
    report(train.output)
