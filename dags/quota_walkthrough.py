"""The AWS quota-management walkthrough as an Airflow DAG: three shares, five training tasks.

It expects the quota of ``examples/quota.yaml`` (a pool of three ``ml.g5.xlarge``; shares
``qs1`` LEND_AND_BORROW with in-share preemption at once, ``qs2`` LEND, ``qs3`` RESERVE, one
instance each) and the quota scheduler running with the local backend::

    airflow-quota apply examples/quota.yaml
    airflow-quota scheduler

Every training task is a ``QuotaTrainingOperator`` running ``train_script.py`` (next to this
file) on the local backend, checkpointing every second. What happens, as the task logs and
``airflow-quota jobs show`` tell it:

1. ``qs1_high``, ``qs1_med`` and ``qs1_low`` (priorities 3, 2, 1) are submitted to qs1, in this
   order. qs1_high runs within qs1's limit; qs1_med **borrows** qs2's idle instance; qs1_low
   waits, since qs3 is RESERVE and lends nothing.
2. ``qs2_job`` arrives. qs2 is under its limit, so it **reclaims** its instance: qs1_med is
   preempted (CROSS_SHARE), requeued with its checkpoint.
3. ``qs3_job`` starts at once on the instance nobody could borrow.
4. ``raise_qs1_low`` raises qs1_low to priority 4 through ``QuotaHook.set_priority`` (it finds
   the job by the XCom ``quota_job_id`` the operator pushed when it submitted). With in-share
   preemption qs1_low preempts qs1_high (IN_SHARE).
5. Everything finishes; the preempted trainings print ``resumed from step N``.

The steps are paced by the quota state, not by the clock: wall-clock sleeps would hold worker
slots and assume every task starts on time, and with few worker slots they do not (the order of
the submissions, whether qs1_low was submitted before it is raised, whether a victim had written
a checkpoint when it was preempted would all depend on the timing). Instead each step starts only
once a short **gate** task, polling the quota database through ``QuotaHook``, sees the state it
relies on:

- ``high_running``: qs1_high runs; then qs1_med is submitted.
- ``med_borrowing``: qs1_med runs on borrowed capacity; then qs1_low is submitted.
- ``low_waiting``: qs1_low waits in the queue and qs1_med has written a checkpoint; then
  ``qs2_job`` is submitted (and preempts qs1_med).
- ``qs2_running``: qs2_job runs and qs1_med is back in the queue; then ``qs3_job`` is submitted.
- ``qs3_running``: the pool is full, qs1_high (which has written a checkpoint) is qs1's only
  running job and qs1_med and qs1_low wait; then ``raise_qs1_low``, which can only preempt
  qs1_high.

So the story is the same on every run however slow the machine, even with two worker slots. The
gates are short tasks in a worker slot; the training tasks wait deferred, in the triggerer,
holding no worker slot however long they are queued or preempted.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, get_current_context, task

from airflow_quota.hooks.quota import QuotaHook
from airflow_quota.operators import QuotaTrainingOperator

TRAIN_SCRIPT = str(Path(__file__).resolve().with_name("train_script.py"))
CHECKPOINTS = os.environ.get(
    "AIRFLOW_QUOTA_EXAMPLE_CHECKPOINTS", os.path.join(tempfile.gettempdir(), "airflow-quota-checkpoints")
)
QUOTA_CONN_ID = "quota_default"
G5 = [{"instance_type": "ml.g5.xlarge", "count": 1}]
STEP_SECONDS = 0.2
CHECKPOINT_EVERY = 5
"""Steps between two checkpoints: one a second."""
GATE_TIMEOUT = 240.0
"""Seconds a gate waits for its quota state before it fails."""


def training(task_id: str, share: str, priority: int, steps: int) -> QuotaTrainingOperator:
    """One of the walkthrough's trainings: one ml.g5.xlarge, ``steps`` steps of ``STEP_SECONDS``."""
    command = [sys.executable, TRAIN_SCRIPT, "--steps", str(steps), "--step-seconds", str(STEP_SECONDS)]
    command += ["--checkpoint-every", str(CHECKPOINT_EVERY)]
    return QuotaTrainingOperator(
        task_id=task_id,
        share=share,
        priority=priority,
        instance_preferences=G5,
        backend="local",
        command=command,
        # one directory per DAG, run and task: a resumed attempt (or an Airflow retry) finds it
        checkpoint_uri=CHECKPOINTS + "/{{ dag.dag_id }}/{{ run_id | replace(':', '-') }}/{{ task.task_id }}",
        checkpoint_interval=CHECKPOINT_EVERY * STEP_SECONDS,
        quota_conn_id=QUOTA_CONN_ID,
        check_interval=1.0,
    )


def _checkpoint_step(task_id: str) -> int:
    """The step of the task's latest checkpoint in this run (0: none yet)."""
    run = get_current_context()["dag_run"]
    path = Path(CHECKPOINTS) / run.dag_id / run.run_id.replace(":", "-") / task_id / "checkpoint.json"
    try:
        return int(json.loads(path.read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def _job(task_id: str) -> Any:
    """The quota job the task submitted in this run (None: not submitted yet)."""
    job_id = get_current_context()["ti"].xcom_pull(task_ids=task_id, key="quota_job_id")
    return None if job_id is None else QuotaHook(QUOTA_CONN_ID).get_job(int(job_id))


@task
def gate(
    wait_for: dict[str, str],
    borrowing: str | None = None,
    checkpointed: list[str] | None = None,
    submitted_ago: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Wait until every task of ``wait_for`` has a quota job in the given state, ``borrowing``'s
    job (one of ``wait_for``) borrows, every task of ``checkpointed`` wrote a checkpoint, and the
    jobs of ``submitted_ago`` (of ``wait_for``) were submitted at least that many seconds ago
    (so that their trigger saw, and logged, the state they are in)."""
    deadline = time.monotonic() + GATE_TIMEOUT
    last = None
    while True:
        jobs = {task_id: _job(task_id) for task_id in wait_for}
        states = {task_id: (job.state if job else None) for task_id, job in jobs.items()}
        steps = {task_id: _checkpoint_step(task_id) for task_id in checkpointed or []}
        borrowed = jobs[borrowing].borrowed if borrowing and jobs[borrowing] is not None else 0
        seen = (states, steps, borrowed)
        if seen != last:
            print(f"quota jobs {states}, checkpoints {steps}, borrowing {borrowed}", flush=True)
            last = seen
        if (
            all(states[t] == wanted for t, wanted in wait_for.items())
            and all(step > 0 for step in steps.values())
            and (borrowing is None or borrowed > 0)
            and all(time.time() - jobs[t].submitted_at >= age for t, age in (submitted_ago or {}).items())
        ):
            return {"states": states, "checkpoints": steps}
        if time.monotonic() > deadline:
            raise RuntimeError(f"gave up after {GATE_TIMEOUT:.0f} s: {states}, checkpoints {steps}")
        time.sleep(0.5)


@task
def raise_qs1_low(priority: int = 4) -> None:
    """Raise qs1_low above qs1_high, as the walkthrough's ``UpdateServiceJob`` does."""
    job_id = get_current_context()["ti"].xcom_pull(task_ids="qs1_low", key="quota_job_id")
    QuotaHook(QUOTA_CONN_ID).set_priority(int(job_id), priority)
    print(f"asked the quota scheduler to raise quota job {job_id} (qs1_low) to priority {priority}")


with DAG(
    dag_id="quota_walkthrough",
    description="The AWS quota-management walkthrough: borrow, reclaim, RESERVE, in-share preemption",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    tags=["airflow-quota", "example"],
):
    # lengths (steps of 0.2 s): qs1_high and qs2_job still run when qs1_low is raised, 20 to 35 s
    # after qs1_high started (a gate, then a submission, take 1 to 6 s in Airflow)
    qs1_high = training("qs1_high", "qs1", priority=3, steps=300)
    qs1_med = training("qs1_med", "qs1", priority=2, steps=200)
    qs1_low = training("qs1_low", "qs1", priority=1, steps=75)
    qs2_job = training("qs2_job", "qs2", priority=1, steps=200)
    qs3_job = training("qs3_job", "qs3", priority=1, steps=150)

    high_running = gate.override(task_id="high_running")({"qs1_high": "RUNNING"})
    med_borrowing = gate.override(task_id="med_borrowing")({"qs1_med": "RUNNING"}, borrowing="qs1_med")
    # qs1_med is preempted only once it has a checkpoint to resume from, and after its trigger
    # logged that it borrows
    low_waiting = gate.override(task_id="low_waiting")(
        {"qs1_low": "RUNNABLE", "qs1_med": "RUNNING"}, checkpointed=["qs1_med"], submitted_ago={"qs1_med": 8.0}
    )
    qs2_running = gate.override(task_id="qs2_running")({"qs2_job": "RUNNING", "qs1_med": "RUNNABLE"})
    # the pool is full and qs1_high (not qs1_med, waiting) is qs1's only running job: the raise
    # can only preempt qs1_high, which has a checkpoint to resume from
    qs3_running = gate.override(task_id="qs3_running")(
        {"qs3_job": "RUNNING", "qs2_job": "RUNNING", "qs1_high": "RUNNING"}
        | {"qs1_med": "RUNNABLE", "qs1_low": "RUNNABLE"},
        checkpointed=["qs1_high"],
        submitted_ago={"qs1_low": 10.0},
    )

    high_running >> [qs1_med, med_borrowing]
    med_borrowing >> [qs1_low, low_waiting]
    low_waiting >> [qs2_job, qs2_running]
    qs2_running >> [qs3_job, qs3_running]
    qs3_running >> raise_qs1_low()
