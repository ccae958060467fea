"""What a ``QuotaExecutor`` try that could not run says in its own log (issue 38).

A real Task SDK supervisor in ``QuotaExecutor``'s worker loop (``executors/worker.py``), told to
reach Airflow's execution API at a port nothing listens on: it forks the task's process, its
start call is refused, and the worker writes one line naming the URL and what to check into the
try's log file (where Airflow's supervisor writes it) and hands that line to the executor as the
event's info. No Airflow scheduler or api-server is needed to show it: the refusal is real.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

LOG_PATH = "dag_id=d/run_id=r/task_id=t/attempt=1.log"

SCRIPT = """
import json, multiprocessing, uuid
from airflow.executors.workloads import BundleInfo, ExecuteTask
from airflow.executors.workloads.task import TaskInstanceDTO
from airflow.configuration import conf
from airflow_quota.executors.worker import run_worker

ti = TaskInstanceDTO(
    id=uuid.uuid4(), task_id="t", dag_id="d", run_id="r", try_number=1, dag_version_id=uuid.uuid4(),
    map_index=-1, pool_slots=1, priority_weight=1, queue="default",
)
workload = ExecuteTask(
    ti=ti, token="t", dag_rel_path="d.py", bundle_info=BundleInfo(name="dags-folder"), log_path=%(log_path)r
)
work, results = multiprocessing.SimpleQueue(), multiprocessing.Queue()
work.put((workload, {"AIRFLOW_QUOTA_JOB_ID": "7"}))
work.put(None)
run_worker("quota-test", work, results, multiprocessing.Value("i", 2), conf)
key, state, cause = results.get(timeout=30)
print(json.dumps({"state": str(state), "cause": cause}))
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_a_try_whose_execution_api_refuses_the_connection_says_so_in_one_line_in_its_log(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/execution/"
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(tmp_path / "home"),
        "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(tmp_path / "logs"),
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": url,
        "AIRFLOW__WORKERS__EXECUTION_API_RETRIES": "1",  # one try: the refusal is the point
        "AIRFLOW__CORE__LOAD_EXAMPLES": "false",
    }
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT % {"log_path": LOG_PATH}],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    expected = (
        f"could not reach Airflow's execution API at {url} (Connection refused): "
        "is the api-server running and [core] execution_api_server_url right?"
    )
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == {"state": "failed", "cause": expected}, result
    records = [json.loads(line) for line in (tmp_path / "logs" / LOG_PATH).read_text().splitlines()]
    assert records[-1]["event"] == expected and records[-1]["level"] == "error", records
    assert sum(expected in json.dumps(r) for r in records) == 1, records  # once, as one line
