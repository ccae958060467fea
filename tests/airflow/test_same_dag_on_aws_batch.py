"""The same DAG either way, in a real Airflow 3.3 (scheduler, dag-processor, triggerer, api-server;
PostgreSQL): ``dags/quota_sagemaker_training.py`` runs once with ``airflow-quota scheduler``
placing and SageMaker (a moto server) running the training, then, unchanged, with ``airflow-quota
scheduler --aws-batch-job-queue quota-queue`` letting AWS Batch place (an endpoint speaking
Batch's rest-json for the service-job calls moto lacks, ``tests/fake_batch.py``). Both runs
succeed; the task, its log and the quota database tell each one's story."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_quota.devtools.stack import BIN, AirflowStack
from tests.airflow.stacks import airflow_on_postgres
from tests.fake_batch import REGION, FakeBatch, fake_batch

pytestmark = pytest.mark.timeout(1200)

REPO = Path(__file__).resolve().parents[2]
DAG = "quota_sagemaker_training"
RUN_TIMEOUT = 240.0


@pytest.fixture(scope="module")
def batch() -> Iterator[FakeBatch]:
    with fake_batch(wait_seconds=1.0, run_seconds=3.0) as endpoint:
        yield endpoint


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory, moto_url: str, batch: FakeBatch) -> Iterator[AirflowStack]:
    aws = {
        "AWS_ENDPOINT_URL_SAGEMAKER": moto_url,
        "AWS_ENDPOINT_URL_BATCH": batch.url,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
        "AIRFLOW_CONN_AWS_DEFAULT": json.dumps({"conn_type": "aws", "extra": {"region_name": REGION}}),
    }
    with airflow_on_postgres(
        "samedag",
        tmp_path_factory.mktemp("airflow-same-dag"),
        dags=[REPO / "dags" / "quota_sagemaker_training.py"],
        quota_config=REPO / "examples" / "quota.yaml",
        components=("scheduler", "dag-processor", "triggerer", "api-server"),  # the quota scheduler: the test's
        wait_for_dags=[DAG],
        extra_env=aws,
    ) as stack:
        yield stack


def run_to_the_end(af: AirflowStack) -> str:
    run_id = af.trigger(DAG)
    states = af.wait_for_runs(DAG, [run_id], RUN_TIMEOUT)
    assert states == {run_id: "success"}, f"{states}\n{af.ti_states(DAG, run_id)}\n{af.tails(30)}"
    return run_id


def test_one_dag_runs_whoever_places_it(airflow: AirflowStack, batch: FakeBatch) -> None:
    quota = [str(BIN / "airflow-quota"), "scheduler", "--db", airflow.quota_url, "--poll-seconds", "0.2"]
    airflow.start_process("quota-scheduler", [*quota, "--state-dir", str(airflow.state_dir), "--region", REGION])
    placed_here = run_to_the_end(airflow)
    airflow.stop(["quota-scheduler"])

    delegating = ["--aws-batch-job-queue", "quota-queue", "--aws-conn-id", "aws_default"]  # as the README
    airflow.start_process("quota-scheduler-aws-batch", [*quota, *delegating, "--aws-batch-mirror-seconds", "1"])
    placed_by_aws = run_to_the_end(airflow)
    airflow.stop(["quota-scheduler-aws-batch"])

    jobs = {job.run_id: job for job in airflow.store.jobs(dag_id=DAG)}
    here, there = jobs[placed_here], jobs[placed_by_aws]
    assert (here.state, here.backend, here.service_job_id) == ("SUCCEEDED", "sagemaker", None)
    assert (there.state, there.backend) == ("SUCCEEDED", "sagemaker")
    assert [a.backend for a in airflow.store.attempts(here.id)] == ["sagemaker"]
    assert [a.backend for a in airflow.store.attempts(there.id)] == ["aws_batch"]
    [submitted] = batch.asked("SubmitServiceJob")
    assert (submitted["quotaShareName"], submitted["schedulingPriority"]) == ("qs1", 3)
    assert submitted["preemptionConfiguration"] == {"preemptionRetriesBeforeTermination": 3}
    assert there.service_job_id == batch.jobs[there.service_job_id].job_id
    for run_id in (placed_here, placed_by_aws):
        log = airflow.task_log(DAG, run_id, "train")
        assert "SUCCEEDED on 1x ml.g5.xlarge" in log, log[-3000:]
    assert "placed by AWS Batch (job queue quota-queue)" in "\n".join(
        event.line for event in airflow.store.events(job_id=there.id)
    )
