"""OpenLineage facets of a quota training (``airflow_quota/operators/lineage.py``).

Unit level: the facet methods of ``QuotaTrainingOperator`` for the sagemaker backend (the
request's S3 inputs, the model artifacts) and the local one (the ``quotaJob`` run facet, no
datasets so the task's own inlets/outlets stand), on a real quota job.

End to end, in a real Airflow 3.3 (``tests/airflow/stacks.py``) with the OpenLineage provider's
file transport (``AIRFLOW__OPENLINEAGE__TRANSPORT``, one JSON event a line): the COMPLETE event
of a training carries the ``quotaJob`` facet; the same run shows a training submitted with
``wait_for_completion=False`` and its ``QuotaJobSensor`` (deferred) succeeding, and the task log
with the training's last lines before the quota's closing lines.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_quota.devtools.stack import AirflowStack
from airflow_quota.operators.lineage import RUN_FACET, QuotaJobRunFacet, s3_dataset
from airflow_quota.operators.training import QuotaTrainingOperator
from tests.airflow.conftest import G5, QuotaWorld
from tests.airflow.stacks import airflow_on_postgres, wait_until
from tests.airflow.task_context import context

REPO = Path(__file__).resolve().parents[2]
DAG_ID = "quota_lineage"

REQUEST: dict[str, Any] = {
    "AlgorithmSpecification": {"TrainingImage": "image", "TrainingInputMode": "File"},
    "RoleArn": "arn:aws:iam::123456789012:role/SageMakerTraining",
    "InputDataConfig": [
        {"ChannelName": "train", "DataSource": {"S3DataSource": {"S3Uri": "s3://data/corpus/train/"}}},
        {"ChannelName": "eval", "DataSource": {"S3DataSource": {"S3Uri": "s3://data/corpus/eval.jsonl"}}},
        {"ChannelName": "fsx", "DataSource": {"FileSystemDataSource": {"DirectoryPath": "/fsx/x"}}},
    ],
    "OutputDataConfig": {"S3OutputPath": "s3://models/output"},
    "ResourceConfig": {"VolumeSizeInGB": 50},
    "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
}


def test_s3_datasets_are_named_as_the_amazon_provider_names_them() -> None:
    dataset = s3_dataset("s3://models/output/job-1/output/model.tar.gz")
    assert (dataset.namespace, dataset.name) == ("s3://models", "output/job-1/output/model.tar.gz")
    assert s3_dataset("s3://bucket").name == "/"


def test_sagemaker_lineage_reads_the_requests_inputs_and_the_model_written() -> None:
    op = QuotaTrainingOperator(
        task_id="train", share="research", instance_preferences=G5, backend="sagemaker", training_request=REQUEST
    )
    start = op.get_openlineage_facets_on_start()
    assert [(d.namespace, d.name) for d in start.inputs] == [
        ("s3://data", "corpus/train/"),
        ("s3://data", "corpus/eval.jsonl"),
    ]
    assert start.outputs == [] and start.run_facets == {}
    op.outcome = {"job_id": 3, "job_name": "llm", "share": "research", "state": "SUCCEEDED", "training_job": "llm-3-1"}
    op.training_description = {"ModelArtifacts": {"S3ModelArtifacts": "s3://models/output/llm-3-1/output/model.tar.gz"}}
    end = op.get_openlineage_facets_on_complete(None)
    assert len(end.inputs) == 2
    assert [(d.namespace, d.name) for d in end.outputs] == [("s3://models", "output/llm-3-1/output/model.tar.gz")]
    facet = end.run_facets[RUN_FACET]
    assert isinstance(facet, QuotaJobRunFacet)
    assert (facet.jobId, facet.backend, facet.trainingJob) == (3, "sagemaker", "llm-3-1")


def test_local_lineage_is_the_quota_jobs_run_facet(world: QuotaWorld) -> None:
    op = QuotaTrainingOperator(
        task_id="train", share="research", instance_preferences=G5, command="true", checkpoint_uri="/ckpt/run-1"
    )
    assert op.get_openlineage_facets_on_complete(None).run_facets == {}  # no job yet: nothing to say
    job = world.submit("ok", {"duration": 3600})
    world.step(1000.0)
    world.step(4600.0)
    event = {"status": "success", "job_id": job.id, "state": "SUCCEEDED", "reason": None, "message": "done"}
    op.execute_complete(context(), event)
    lineage = op.get_openlineage_facets_on_complete(None)
    assert lineage.inputs == [] and lineage.outputs == []  # the task's inlets/outlets stand for them
    facet = lineage.run_facets[RUN_FACET]
    assert (facet.jobId, facet.share, facet.state, facet.instanceType, facet.instanceCount) == (
        job.id,
        "research",
        "SUCCEEDED",
        "ml.g5.xlarge",
        1,
    )
    assert (facet.attempts, facet.preemptions, facet.gpuHours, facet.checkpointUri) == (1, 0, 1.0, "/ckpt/run-1")


# -- end to end ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def airflow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AirflowStack]:
    root = tmp_path_factory.mktemp("airflow-lineage")
    transport = {"type": "file", "log_file_path": str(root / "openlineage.jsonl"), "append": True}
    with airflow_on_postgres(
        "lineage",
        root,
        dags=[REPO / "tests" / "airflow" / "lineage_dags" / "quota_lineage.py"],
        quota_config=REPO / "examples" / "quota.yaml",
        wait_for_dags=[DAG_ID],
        extra_env={
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(transport),
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "e2e",
        },
    ) as stack:
        yield stack


def lineage_events(af: AirflowStack) -> list[dict[str, Any]]:
    path = af.settings.root / "openlineage.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def logged_at(log: str, text: str) -> str:
    """When a task log's JSON line holding ``text`` was logged (ISO time, UTC: sorts as text)."""
    for line in log.splitlines():
        if text in line and line.startswith("{"):
            return str(json.loads(line)["timestamp"])
    raise AssertionError(f"{text!r} is not in the task log:\n{log}")


@pytest.mark.timeout(900)
def test_a_trainings_complete_event_carries_its_quota_job(airflow: AirflowStack) -> None:
    run_id = airflow.trigger(DAG_ID)
    states = airflow.wait_for_runs(DAG_ID, [run_id], timeout=420)
    logs = "\n".join(airflow.task_log(DAG_ID, run_id, task)[-4000:] for task in ("train", "submit", "wait"))
    assert states[run_id] == "success", f"{airflow.ti_states(DAG_ID, run_id)}\n{logs}\n{airflow.tails(20)}"
    jobs = {j.task_id: j for j in airflow.store.jobs(dag_id=DAG_ID)}
    assert jobs["train"].state == jobs["submit"].state == "SUCCEEDED"

    def complete_event() -> dict[str, Any] | None:
        for event in lineage_events(airflow):
            if event.get("eventType") == "COMPLETE" and event["job"]["name"] == f"{DAG_ID}.train":
                return event
        return None

    wait_until("the training's COMPLETE event in the file transport", complete_event, airflow, timeout=60)
    event = complete_event()
    assert event is not None
    facet = event["run"]["facets"][RUN_FACET]
    assert (facet["jobId"], facet["share"], facet["state"], facet["backend"]) == (
        jobs["train"].id,
        "qs1",
        "SUCCEEDED",
        "local",
    )
    assert (facet["instanceType"], facet["instanceCount"], facet["attempts"]) == ("ml.g5.xlarge", 1, 1)

    log = airflow.task_log(DAG_ID, run_id, "train")  # the worker's file, then the triggerer's: by time
    order = [
        logged_at(log, "[training, attempt 1] the last line"),
        logged_at(log, "SUCCEEDED after 1 attempt(s)"),
        logged_at(log, f"quota job {jobs['train'].id} SUCCEEDED on 1x ml.g5.xlarge"),
    ]
    assert order == sorted(order), log
    assert "not waiting for it (wait_for_completion=False)" in airflow.task_log(DAG_ID, run_id, "submit")
    assert "SUCCEEDED after 1 attempt(s)" in airflow.task_log(DAG_ID, run_id, "wait")
