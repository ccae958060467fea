"""A ``QuotaExecutor`` task placed while Airflow's execution API does not answer (issue 38).

A real Airflow 3.3 without its api-server (scheduler, dag-processor and ``airflow-quota
scheduler``, as while an api-server is still starting): the quota scheduler places the task,
the executor releases it, and its supervisor's start call to the execution API is refused. The
try's own log says so in one line naming the URL and the setting to check, and the quota job's
failure detail carries that line instead of ``AirflowTask:queued: attempt 1 of 1 failed``.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_quota.devtools.stack import AirflowStack
from tests.airflow.stacks import EXECUTOR_DAGS, airflow_on_postgres, diagnosis, wait_until

pytestmark = pytest.mark.timeout(900)

DAG_ID = "quota_exec_ops"


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowStack]:
    with airflow_on_postgres(
        "noapi",
        tmp_path_factory.mktemp("airflow-noapi"),
        dags=[EXECUTOR_DAGS / name for name in ("quota_exec_training.py", "quota_exec_reclaim.py")],
        quota_config=EXECUTOR_DAGS / "quota.yaml",
        components=("scheduler", "dag-processor", "quota-scheduler"),
        wait_for_dags=(DAG_ID,),
        start_timeout=300.0,
        extra_env={
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor,quota:airflow_quota.executors.QuotaExecutor",
            "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "1",  # one try: the refusal is the point
        },
    ) as stack:
        yield stack


def airflow_cli(af: AirflowStack, *args: str) -> str:
    """``airflow ARGS`` with the stack's environment (no api-server to ask: the CLI reads the
    metadata database)."""
    airflow = Path(af.env["PATH"].split(":")[0]) / "airflow"
    done = subprocess.run([str(airflow), *args], env=af.env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_a_task_whose_execution_api_does_not_answer_says_so_in_its_log_and_its_quota_job(
    airflow: AirflowStack,
) -> None:
    af = airflow
    run_id = "manual__no_api"
    airflow_cli(af, "dags", "unpause", DAG_ID)
    airflow_cli(af, "dags", "trigger", DAG_ID, "--run-id", run_id)
    wait_until("the run failed", lambda: af.run_state(DAG_ID, run_id) == "failed", af, 300)
    url = af.env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"]
    line = (
        f"could not reach Airflow's execution API at {url} (Connection refused): "
        "is the api-server running and [core] execution_api_server_url right?"
    )
    log = af.home / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}" / "task_id=ops_job" / "attempt=1.log"
    events = [json.loads(text).get("event") for text in log.read_text().splitlines() if text.startswith("{")]
    assert events.count(line) == 1, events

    def job_failed() -> bool:
        return [j.state for j in af.store.jobs(dag_id=DAG_ID)] == ["FAILED"]

    wait_until("the quota job FAILED", job_failed, af, 30)
    job = af.store.jobs(dag_id=DAG_ID)[0]
    assert job.detail is not None and f"AirflowTask:queued: {line}" in job.detail, diagnosis(af, (DAG_ID, run_id))
    print(f"\nops_job's log: {line}\nits quota job: {job.reason}: {job.detail}")
