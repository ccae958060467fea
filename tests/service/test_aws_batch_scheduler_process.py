"""``airflow-quota scheduler --aws-batch-job-queue Q`` as a process: jobs submitted from the command
line go to AWS Batch (an endpoint speaking Batch's rest-json, ``tests/fake_batch.py``, through the
scheduler's own botocore client: ``AWS_ENDPOINT_URL_BATCH``) and come back as the quota database's
jobs, with the same commands a self-placing scheduler answers; on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.aws_batch.aws import TRAINING
from tests.conftest import cli
from tests.fake_batch import REGION, FakeBatch, fake_batch
from tests.service.chaos import Env, Scheduler, cli_json, prepared
from tests.waiting import wait_for

QUOTA = {
    "pool": {"capacity": {"ml.g5.xlarge": 4}},
    "shares": [
        {"name": "team-a", "capacity_limits": {"ml.g5.xlarge": 2}, "strategy": "LEND_AND_BORROW", "borrow_limit": 100},
        {"name": "team-b", "capacity_limits": {"ml.g5.xlarge": 2}, "strategy": "LEND"},
    ],
}


@pytest.fixture
def batch() -> Iterator[FakeBatch]:
    with fake_batch(wait_seconds=0.5, run_seconds=1.5) as endpoint:
        yield endpoint


def job_file(tmp_path: Path, name: str, share: str, backend: str = "sagemaker", **fields: Any) -> str:
    path = tmp_path / f"{name}.yaml"
    job = {
        "name": name,
        "share": share,
        "priority": 5,
        "preferences": [{"instance_type": "ml.g5.xlarge", "count": 1}],
        "backend": backend,
        "training": TRAINING if backend == "sagemaker" else {"command": ["true"]},
        **fields,
    }
    path.write_text(yaml.safe_dump(job))
    return str(path)


def test_jobs_submitted_from_the_command_line_run_on_aws_batch_and_end_in_the_quota_database(
    db_url: str, tmp_path: Path, batch: FakeBatch, schedulers: list[Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_quota.store.settings import normalize

    url = normalize(db_url)
    prepared(url, QUOTA)
    for name, value in {"AWS_ENDPOINT_URL_BATCH": batch.url, "AWS_ACCESS_KEY_ID": "testing",
                        "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": REGION}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    scheduler = Scheduler(
        Env(url, tmp_path), "--aws-batch-job-queue", "quota-queue", "--aws-batch-mirror-seconds", "0.2"
    )
    schedulers.append(scheduler)
    scheduler.wait_for_log("AWS Batch job queue quota-queue places")

    submitted = cli_json(url, "jobs", "submit", job_file(tmp_path, "train-a", "team-a", preemption_retries=2))
    refused = cli("jobs", "submit", job_file(tmp_path, "local-a", "team-a", backend="local"), "--db", url)
    assert refused.code == 0  # the store takes it; the scheduler refuses it

    def state(job: int) -> str:
        return str(cli_json(url, "jobs", "show", str(job))["state"])

    wait_for(lambda: state(submitted["id"]) == "SUCCEEDED", 30, "train-a SUCCEEDED on AWS Batch")
    [request] = batch.asked("SubmitServiceJob")
    assert (request["jobQueue"], request["quotaShareName"], request["schedulingPriority"]) == (
        "quota-queue",
        "team-a",
        5,
    )
    assert request["preemptionConfiguration"] == {"preemptionRetriesBeforeTermination": 2}
    payload = json.loads(request["serviceRequestPayload"])
    assert payload["ResourceConfig"]["InstancePreferences"] == [{"InstanceType": "ml.g5.xlarge", "InstanceCount": 1}]
    shown = cli_json(url, "jobs", "show", str(submitted["id"]))
    assert [line.split()[1] for line in shown["events"]] == ["SUBMITTED", "PLACED", "SUCCEEDED"]
    assert "placed by AWS Batch (job queue quota-queue)" in shown["events"][1]
    assert cli("jobs", "show", "local-a", "--db", url).code == 2  # refused: nothing kept of it
    log = scheduler.log()
    assert "REJECTED submit of local-a [team-a]: backend: 'local' jobs cannot run on AWS Batch" in log
    assert "PLACED train-a [team-a]" in log and "SUCCEEDED train-a [team-a]" in log
    lists = batch.asked("ListServiceJobs")
    assert lists and all(call["filters"][0]["name"] == "QUOTA_SHARE_NAME" for call in lists)
    assert scheduler.terminate() == 0
