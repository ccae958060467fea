"""An instance preference list at work: the first type is taken, the job falls back to the second.

A training asks for ``ml.g5.xlarge`` first and accepts ``ml.g4dn.xlarge`` (cheaper, slower)
instead, waiting at most ``max_pending_time`` in total for either. The quota scheduler tries the
entries in order at every cycle and places the job on the first that fits now; the training
reads ``QUOTA_INSTANCE_TYPE`` and ``QUOTA_GPUS`` and sizes itself for what it got.

It expects the quota of ``examples/quota.yaml`` plus one ``ml.g4dn.xlarge`` for share ``qs3``
(``QUOTA`` below, in YAML)::

    pool:
      capacity: {ml.g5.xlarge: 3, ml.g4dn.xlarge: 1}
    shares:
      - {name: qs1, capacity_limits: {ml.g5.xlarge: 1}, strategy: LEND_AND_BORROW,
         borrow_limit: 200, in_share_preemption: true, in_share_preemption_after_seconds: 0}
      - {name: qs2, capacity_limits: {ml.g5.xlarge: 1}, strategy: LEND}
      - {name: qs3, capacity_limits: {ml.g5.xlarge: 1, ml.g4dn.xlarge: 1}, strategy: RESERVE}

Save it as ``fallback-quota.yaml``, then ``airflow-quota apply fallback-quota.yaml`` and run
``airflow-quota scheduler``. The walkthrough and the daily DAG run on this quota too.

The run:

1. ``rival_takes_g5``: another team's job takes qs3's only ``ml.g5.xlarge`` (submitted straight
   through ``QuotaHook``, as any client of the quota service may; the task waits until it runs).
   qs3 is RESERVE: it never borrows, so no other g5 is within its reach.
2. ``g4dn_free`` (``QuotaCapacitySensor``): waits until qs3 could place the fallback entry now.
3. ``train`` (``QuotaTrainingOperator``): its list is g5 then g4dn. The g5 entry has no quota
   left, so the job is placed on ``ml.g4dn.xlarge``; its log says
   ``PLACED … on 1x ml.g4dn.xlarge`` and the training prints ``sized for 1x ml.g4dn.xlarge``.
   Had neither entry been placeable for 10 minutes, the task would fail with PENDING_TIMEOUT.
4. ``rival_done`` (``QuotaJobSensor``): waits, deferred, until the rival job is final.
5. ``report``: which entry of the list the training got, from its XCom summary.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, get_current_context, task

from airflow_quota.core.model import JobRequest, JobState
from airflow_quota.hooks.quota import QuotaHook
from airflow_quota.operators import QuotaTrainingOperator
from airflow_quota.operators.training import derived_job_name
from airflow_quota.sensors import QuotaCapacitySensor, QuotaJobSensor

TRAIN_SCRIPT = str(Path(__file__).resolve().with_name("train_script.py"))
CHECKPOINTS = os.environ.get(
    "AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS", os.path.join(tempfile.gettempdir(), "airflow-quota-checkpoints")
)
CHECKPOINT_URI = CHECKPOINTS + "/{{ dag.dag_id }}/{{ run_id | replace(':', '-') }}/{{ task.task_id }}"
QUOTA_CONN_ID = "quota_default"
G5 = {"instance_type": "ml.g5.xlarge", "count": 1}
G4DN = {"instance_type": "ml.g4dn.xlarge", "count": 1}
RIVAL_SECONDS = 20

QUOTA: dict[str, Any] = {
    "pool": {"capacity": {"ml.g5.xlarge": 3, "ml.g4dn.xlarge": 1}},
    "shares": [
        {
            "name": "qs1",
            "capacity_limits": {"ml.g5.xlarge": 1},
            "strategy": "LEND_AND_BORROW",
            "borrow_limit": 200,
            "in_share_preemption": True,
            "in_share_preemption_after_seconds": 0,
        },
        {"name": "qs2", "capacity_limits": {"ml.g5.xlarge": 1}, "strategy": "LEND"},
        {"name": "qs3", "capacity_limits": {"ml.g5.xlarge": 1, "ml.g4dn.xlarge": 1}, "strategy": "RESERVE"},
    ],
}
"""The quota this DAG expects, as in the module's docstring."""


@task
def rival_takes_g5() -> int:
    """Submit another team's job to qs3's g5 (once per run, by its client token); return its id
    once it runs."""
    ti = get_current_context()["ti"]
    hook = QuotaHook(QUOTA_CONN_ID)
    job = hook.submit(
        JobRequest(name=derived_job_name(ti.dag_id, "rival", ti.run_id, -1), share="qs3", preferences=[G5]),
        "local",
        {"command": [sys.executable, TRAIN_SCRIPT, "--steps", str(RIVAL_SECONDS * 10), "--step-seconds", "0.1"]},
        client_token=f"example/{ti.dag_id}/{ti.run_id}/rival",
        dag_id=ti.dag_id,
        task_id=ti.task_id,
        run_id=ti.run_id,
    )
    deadline = time.monotonic() + 120
    while (current := hook.get_job(job.id)) is not None and current.state != JobState.RUNNING.value:
        if current.state in (JobState.SUCCEEDED.value, JobState.FAILED.value) or time.monotonic() > deadline:
            raise RuntimeError(f"the rival job did not start: {current.state} {current.reason or ''}")
        time.sleep(0.5)
    print(f"rival quota job {job.id} runs on qs3's ml.g5.xlarge")
    return job.id


@task
def report() -> str:
    """Which entry of the list the training got, from the summary ``train`` returned to XCom."""
    summary: dict[str, Any] = get_current_context()["ti"].xcom_pull(task_ids="train")
    entries = [G5["instance_type"], G4DN["instance_type"]]
    chosen = summary["instance_type"]
    position = entries.index(chosen) + 1 if chosen in entries else "?"
    print(f"trained on {summary['instance_count']}x {chosen}: entry {position} of {entries}")
    return str(chosen)


with DAG(
    dag_id="quota_preference_fallback",
    description="A preference list falls back to its second entry when the first has no quota left",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    tags=["airflow-quota", "example"],
):
    rival = rival_takes_g5()
    g4dn_free = QuotaCapacitySensor(
        task_id="g4dn_free",
        share="qs3",
        instance_preferences=[G4DN],
        quota_conn_id=QUOTA_CONN_ID,
        poke_interval=2,
        timeout=600,
    )
    train = QuotaTrainingOperator(
        task_id="train",
        share="qs3",
        priority=1,
        instance_preferences=[G5, G4DN],  # tried in this order, at every cycle
        max_pending_time=timedelta(minutes=10),  # in total, for any entry; then PENDING_TIMEOUT
        backend="local",
        command=[sys.executable, TRAIN_SCRIPT, "--steps", "30", "--step-seconds", "0.05"],
        checkpoint_uri=CHECKPOINT_URI,
        checkpoint_interval=0.5,
        quota_conn_id=QUOTA_CONN_ID,
        check_interval=2.0,
    )
    rival_done = QuotaJobSensor(
        task_id="rival_done",
        job_id="{{ ti.xcom_pull(task_ids='rival_takes_g5') }}",
        quota_conn_id=QUOTA_CONN_ID,
        poke_interval=2,
        timeout=600,
    )
    rival >> g4dn_free >> train >> rival_done
    train >> report()
