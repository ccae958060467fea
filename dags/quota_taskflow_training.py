"""TaskFlow with QuotaTrainingOperator: what to train, where and how urgently, decided by a task.

A ``@task`` looks at the run and returns a plan: the share to charge, the priority and the
longest acceptable wait. The training takes those values straight
from the plan's outputs (``plan["share"]`` and the like are TaskFlow outputs, resolved when the
training task runs); the GPU count comes from a Jinja template over the DAG's params. Nothing
of this is known when the DAG file is parsed, so the operator checks those arguments once
rendered, in ``execute``, with the same messages as at parse time. Jinja renders to text: a
rendered ``"2"`` counts as the integer 2, and a rendered JSON list as that list. Last, a
``@task`` reads the training's summary from XCom (its return value, as any TaskFlow output).

It runs on the quota of ``quota_preference_fallback.py`` (share ``qs1`` owns one ml.g5.xlarge)::

    airflow-quota apply fallback-quota.yaml
    airflow-quota scheduler
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, Param, task

from airflow_quota.operators import QuotaTrainingOperator

TRAIN_SCRIPT = str(Path(__file__).resolve().with_name("train_script.py"))
CHECKPOINTS = os.environ.get(
    "AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS", os.path.join(tempfile.gettempdir(), "airflow-quota-checkpoints")
)


@task
def plan(**context: Any) -> dict[str, Any]:
    """Decide the share, the priority and the longest wait from what the run asks for."""
    urgent = bool(context["params"]["urgent"])
    return {
        "share": "qs1",
        "priority": 3 if urgent else 1,
        "max_pending_seconds": 600 if urgent else 3600,
    }


@task
def report(summary: dict[str, Any]) -> str:
    """The training's summary, from its XCom: where it ran and how long it waited."""
    line = (
        f"quota job {summary['job_id']} {summary['state']} on {summary['instance_count']}x "
        f"{summary['instance_type']} in share {summary['share']}, waited {summary['wait_seconds']:.0f} s"
    )
    print(line)
    return line


with DAG(
    dag_id="quota_taskflow_training",
    description="A training whose share, preferences and priority come from a TaskFlow task",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    params={"urgent": Param(False, type="boolean"), "gpus": Param(1, type="integer", minimum=1)},
    tags=["airflow-quota", "example"],
):
    decided = plan()
    train = QuotaTrainingOperator(
        task_id="train",
        share=decided["share"],
        instance_preferences=[{"instance_type": "ml.g5.xlarge", "count": "{{ params.gpus }}"}],
        priority=decided["priority"],
        max_pending_time=decided["max_pending_seconds"],
        backend="local",
        command=[sys.executable, TRAIN_SCRIPT, "--steps", "20", "--step-seconds", "0.05"],
        checkpoint_uri=CHECKPOINTS + "/{{ dag.dag_id }}/{{ run_id | replace(':', '-') }}",
        checkpoint_interval=0.5,
        check_interval=2.0,
    )
    decided >> train
    report(train.output)
