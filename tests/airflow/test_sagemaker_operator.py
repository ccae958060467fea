"""QuotaTrainingOperator with the sagemaker backend, as a ``SageMakerTrainingOperator`` user
expects it: the request prepared and checked by botocore's model before anything is submitted,
the role name expanded through the task's AWS connection, and the result, links and stored
training job of the attempt that ran, against a real moto server (SageMaker and IAM) and the
real quota scheduler driving a real ``SageMakerBackend``."""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_quota.operators.training import QuotaTrainingOperator
from airflow_quota.plugins.links import SageMakerTrainingJobLink, TrainingLogsLink
from airflow_quota.service.backends.sagemaker import SageMakerBackend
from tests.airflow.conftest import G5, QUOTA, QuotaWorld, quota_world
from tests.airflow.task_context import TaskInstance, context, deferred
from tests.moto_server import REGION

ROLE_NAME = "SageMakerTraining"
REQUEST: dict[str, Any] = {
    "AlgorithmSpecification": {
        "TrainingImage": f"123456789012.dkr.ecr.{REGION}.amazonaws.com/llm-train:1.4",
        "TrainingInputMode": "File",
    },
    "RoleArn": ROLE_NAME,
    "OutputDataConfig": {"S3OutputPath": "s3://team-a-models/output"},
    "ResourceConfig": {"VolumeSizeInGB": "200"},
    "StoppingCondition": {"MaxRuntimeInSeconds": "86400"},
}
"""A request as Jinja leaves it: a role name, integers as text."""


@pytest.fixture
def aws(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The ``aws_moto`` Airflow connection to the moto server, with the training role in IAM;
    returns the role's ARN."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_MOTO",
        json.dumps({"conn_type": "aws", "extra": {"endpoint_url": moto_url, "region_name": REGION}}),
    )
    iam = boto3.client("iam", region_name=REGION, endpoint_url=moto_url)
    try:
        arn: str = iam.get_role(RoleName=ROLE_NAME)["Role"]["Arn"]
    except iam.exceptions.NoSuchEntityException:
        arn = iam.create_role(RoleName=ROLE_NAME, AssumeRolePolicyDocument="{}")["Role"]["Arn"]
    return arn


@pytest.fixture
def sagemaker_world(
    tmp_path: Path, aws: str, moto_url: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[QuotaWorld, SageMakerBackend]]:
    """The quota world of ``tests/airflow/conftest.py`` whose scheduler runs the sagemaker
    backend on the moto server."""
    sagemaker = SageMakerBackend(region_name=REGION, endpoint_url=moto_url, name_prefix=f"t{uuid.uuid4().hex[:8]}")
    with quota_world(tmp_path, monkeypatch, {"sagemaker": sagemaker}) as world:
        yield world, sagemaker


def test_a_share_s_aws_connection_serves_the_jobs_that_name_none(
    sagemaker_world: tuple[QuotaWorld, SageMakerBackend], aws: str
) -> None:
    """Without its own ``aws_conn_id`` a job runs with its share's (quota.yaml): the task's role
    expansion goes through it, and so do the quota scheduler's SageMaker calls for the job."""
    world, sagemaker = sagemaker_world
    research, prod = QUOTA["shares"]
    world.store.apply_config({**QUOTA, "shares": [{**research, "aws_conn_id": "aws_moto"}, prod]})
    world.step()
    job = world.job(deferred(sagemaker_operator(aws_conn_id=None), context()).job_id)
    assert job.training["RoleArn"] == aws and job.aws_conn_id is None
    world.step(1000.0)
    attempt = world.store.attempts(job.id)[0]
    assert attempt.external_name is not None
    assert sagemaker._connection_clients.keys() == {"aws_moto"}  # the scheduler's calls used it


def sagemaker_operator(**overrides: Any) -> QuotaTrainingOperator:
    arguments: dict[str, Any] = {
        "task_id": "train",
        "share": "research",
        "instance_preferences": G5,
        "backend": "sagemaker",
        "training_request": copy.deepcopy(REQUEST),
        "checkpoint_uri": "s3://team-a-models/checkpoints/train",
        "aws_conn_id": "aws_moto",
        "check_interval": 0.01,
    }
    return QuotaTrainingOperator(**{**arguments, **overrides})


def test_the_request_is_cast_and_its_role_expanded_before_it_is_submitted(
    sagemaker_world: tuple[QuotaWorld, SageMakerBackend], aws: str
) -> None:
    world, _ = sagemaker_world
    job = world.job(deferred(sagemaker_operator(), context()).job_id)
    assert job.aws_conn_id == "aws_moto"  # the quota scheduler runs its training jobs with it
    assert job.training["RoleArn"] == aws
    assert job.training["ResourceConfig"] == {"VolumeSizeInGB": 200}
    assert job.training["StoppingCondition"] == {"MaxRuntimeInSeconds": 86400}


@pytest.mark.parametrize(
    ("breakage", "named"),
    [
        pytest.param(
            lambda r: r.update(AlgorithmSpec=r.pop("AlgorithmSpecification")),
            'training_request: Unknown parameter in input: "AlgorithmSpec"',
            id="a misspelt field",
        ),
        pytest.param(
            lambda r: r.pop("OutputDataConfig"),
            'training_request: Missing required parameter in input: "OutputDataConfig"',
            id="a missing required field",
        ),
        pytest.param(
            lambda r: r["ResourceConfig"].update(VolumeSizeInGB="large"),
            "training_request: Invalid type for parameter ResourceConfig.VolumeSizeInGB",
            id="text where an integer goes",
        ),
        pytest.param(
            lambda r: r["StoppingCondition"].update(MaxRuntimeInSeconds=0),
            "training_request: Invalid value for parameter StoppingCondition.MaxRuntimeInSeconds",
            id="a number under SageMaker's minimum",
        ),
    ],
)
def test_a_bad_request_fails_the_task_naming_the_field_and_submits_nothing(
    sagemaker_world: tuple[QuotaWorld, SageMakerBackend], breakage: Any, named: str
) -> None:
    world, _ = sagemaker_world
    request = copy.deepcopy(REQUEST)
    breakage(request)
    with pytest.raises(AirflowFailException, match="checked before submitting") as failure:
        sagemaker_operator(training_request=request).execute(context())
    assert named in str(failure.value)
    assert world.store.jobs() == []


def test_a_role_iam_does_not_know_fails_the_task_and_submits_nothing(
    sagemaker_world: tuple[QuotaWorld, SageMakerBackend],
) -> None:
    world, _ = sagemaker_world
    request = {**copy.deepcopy(REQUEST), "RoleArn": "NoSuchRole"}
    refused = r"training_request\.RoleArn: cannot expand the role name 'NoSuchRole'"
    with pytest.raises(AirflowFailException, match=refused):
        sagemaker_operator(training_request=request).execute(context())
    assert world.store.jobs() == []


def test_success_returns_the_training_job_as_the_provider_does_with_its_links(
    sagemaker_world: tuple[QuotaWorld, SageMakerBackend],
) -> None:
    world, sagemaker = sagemaker_world
    ti = TaskInstance()
    op = sagemaker_operator()
    job_id = deferred(op, context(ti)).job_id
    world.step(1000.0)  # placed, and the training job created on moto
    attempt = world.store.attempts(job_id)[0]
    assert attempt.external_name is not None and attempt.external_name.startswith(sagemaker.name_prefix)
    created = sagemaker.client.describe_training_job(TrainingJobName=attempt.external_name)
    assert attempt.external_arn == created["TrainingJobArn"]
    world.step(1031.0)  # the next poll (30 s): moto has every job Completed at once
    job = world.job(job_id)
    assert job.state == "SUCCEEDED"

    result = op.execute_complete(
        context(ti), {"status": "success", "job_id": job_id, "state": job.state, "reason": None, "message": "done"}
    )
    assert set(result) == {"Training", "quota"}
    assert result["Training"]["TrainingJobName"] == attempt.external_name
    assert result["Training"]["TrainingJobArn"] == attempt.external_arn
    assert result["Training"]["ResourceConfig"]["InstanceType"] == "ml.g5.xlarge"
    assert result["Training"]["CheckpointConfig"]["S3Uri"] == "s3://team-a-models/checkpoints/train"
    json.dumps(result)  # plain values only: XCom can hold it
    assert result["quota"]["job_id"] == job_id and result["quota"]["state"] == "SUCCEEDED"

    console = ti.xcoms[SageMakerTrainingJobLink.key]
    assert console["job_name"] == attempt.external_name and console["region_name"] == REGION
    assert SageMakerTrainingJobLink().format_link(**console) == (
        f"https://console.aws.amazon.com/sagemaker/home?region={REGION}#/jobs/{attempt.external_name}"
    )
    logs = TrainingLogsLink().format_link(**ti.xcoms[TrainingLogsLink.key])
    assert logs.startswith(f"https://console.aws.amazon.com/cloudwatch/home?region={REGION}#logsV2:log-groups/")
    assert logs.endswith(f"logStreamNameFilter$3D{attempt.external_name}")


def test_the_local_backend_returns_the_quota_summary_alone(world: QuotaWorld) -> None:
    job = world.submit("ok", {"duration": 60})
    world.step(1000.0)
    world.step(1060.0)
    ti = TaskInstance()
    op = QuotaTrainingOperator(task_id="train", share="research", instance_preferences=G5, command="true")
    result = op.execute_complete(
        context(ti), {"status": "success", "job_id": job.id, "state": "SUCCEEDED", "reason": None, "message": "ok"}
    )
    assert result["job_id"] == job.id and "Training" not in result
    assert SageMakerTrainingJobLink.key not in ti.xcoms
