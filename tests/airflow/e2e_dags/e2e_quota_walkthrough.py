"""The AWS walkthrough for the end-to-end test, paced by the quota state instead of the clock.

The same five trainings and the same story as ``dags/quota_walkthrough.py`` (quota of
``examples/quota.yaml``): ``qs1_high`` runs within qs1's limit, ``qs1_med`` borrows qs2's idle
instance, ``qs1_low`` waits; ``qs2_job`` reclaims its instance (CROSS_SHARE preemption of
qs1_med); ``qs3_job`` starts on the RESERVE instance; ``qs1_low`` is raised to priority 4 and
preempts ``qs1_high`` (IN_SHARE). Everything then finishes, the preempted trainings resuming
from their checkpoints.

The example DAG spaces these steps with wall-clock sleeps, which hold worker slots and assume
every task starts on time. With two worker slots (as in the test) they do not: the order of the
submissions and whether a victim had reached a checkpoint when it was preempted depend on the
timing. Here each step starts only once the quota state it relies on is there (a short gate
task polls the quota database through ``QuotaHook``), and a victim is preempted only after its
training wrote a checkpoint, so the story is the same on every run however slow the machine.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from airflow.sdk import DAG, get_current_context, task

from airflow_quota.hooks.quota import QuotaHook
from airflow_quota.operators import QuotaTrainingOperator

TRAIN_SCRIPT = str(Path(__file__).resolve().parents[3] / "dags" / "train_script.py")
CHECKPOINTS = os.environ.get(
    "AIRFLOW_QUOTA_E2E_CHECKPOINTS", os.path.join(tempfile.gettempdir(), "airflow-quota-e2e-checkpoints")
)
QUOTA_CONN_ID = "quota_default"
G5 = [{"instance_type": "ml.g5.xlarge", "count": 1}]
STEP_SECONDS = 0.2
CHECKPOINT_EVERY = 5
"""Steps between two checkpoints: one a second."""
GATE_TIMEOUT = 240.0


def training(task_id: str, share: str, priority: int, steps: int) -> QuotaTrainingOperator:
    command = [sys.executable, TRAIN_SCRIPT, "--steps", str(steps), "--step-seconds", str(STEP_SECONDS)]
    command += ["--checkpoint-every", str(CHECKPOINT_EVERY)]
    return QuotaTrainingOperator(
        task_id=task_id,
        share=share,
        priority=priority,
        instance_preferences=G5,
        backend="local",
        command=command,
        checkpoint_uri=CHECKPOINTS + "/{{ dag.dag_id }}/{{ run_id | replace(':', '-') }}/{{ task.task_id }}",
        checkpoint_interval=CHECKPOINT_EVERY * STEP_SECONDS,
        quota_conn_id=QUOTA_CONN_ID,
        poll_interval=1.0,
    )


def _checkpoint_step(task_id: str) -> int:
    """The step of the task's latest checkpoint in this run (0: none yet)."""
    context = get_current_context()
    run = context["dag_run"]
    path = Path(CHECKPOINTS) / run.dag_id / run.run_id.replace(":", "-") / task_id / "checkpoint.json"
    try:
        return int(json.loads(path.read_text())["step"])
    except (OSError, ValueError, KeyError):
        return 0


def _job(task_id: str) -> Any:
    ti = get_current_context()["ti"]
    job_id = ti.xcom_pull(task_ids=task_id, key="quota_job_id")
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
    dag_id="e2e_quota_walkthrough",
    description="The AWS walkthrough, each step gated on the quota state (end-to-end test)",
    schedule=None,
    catchup=False,
    tags=["airflow-quota", "test"],
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
    low_waiting = gate.override(task_id="low_waiting")(
        {"qs1_low": "RUNNABLE", "qs1_med": "RUNNING"}, checkpointed=["qs1_med"], submitted_ago={"qs1_med": 8.0}
    )
    qs2_running = gate.override(task_id="qs2_running")({"qs2_job": "RUNNING", "qs1_med": "RUNNABLE"})
    # the pool is full and qs1_high (not qs1_med, waiting) is qs1's only running job: the raise
    # can only preempt qs1_high
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
