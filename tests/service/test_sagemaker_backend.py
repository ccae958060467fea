"""The ``sagemaker`` backend, checked against botocore's own service model and a moto server.

Three kinds of test:

- request shapes: a real boto3 client with ``botocore.stub.Stubber``. The Stubber checks the
  exact parameters sent, and the client still validates them against the SageMaker service
  model before the Stubber answers, so a request botocore would refuse cannot pass here.
- a real moto server (``python -m moto.server`` in a subprocess): create, describe, status,
  idempotent start, a poll of an attempt never started. What moto 5.2.5 does not do, and is
  covered with the Stubber instead:
    * StopTrainingJob is not implemented (the server answers 500 ``NotImplementedError``);
    * every training job is Completed/Completed at once, so only SUCCEEDED can be seen;
    * CreateTrainingJob with a name in use silently replaces the job instead of answering
      ResourceInUse (which is why ``start`` looks the name up before creating);
    * nothing is validated server-side (TrainingPlanArn is stored and echoed verbatim).
- the status mapping table: every TrainingJobStatus / SecondaryStatus / FailureReason case,
  as DescribeTrainingJob responses the Stubber validates against the output shape.
"""

from __future__ import annotations

import copy
import json
import re
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from typing import Any

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from botocore.stub import Stubber

from airflow_quota.service.backends.base import (
    AttemptSpec,
    AttemptStatus,
    Backend,
    BackendError,
    BackendThrottled,
    ListedChange,
)
from airflow_quota.service.backends.sagemaker import SageMakerBackend, training_job_name
from tests.moto_server import REGION

ACCOUNT = "123456789012"
PLAN_ARN = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-plan/p5-week"
NAME_PATTERN = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
NOT_FOUND = "Requested resource not found."
"""What SageMaker answers to DescribeTrainingJob for a name it does not know."""

TRAINING: dict[str, Any] = {
    "AlgorithmSpecification": {
        "TrainingImage": f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/llm-train:1.4",
        "TrainingInputMode": "File",
    },
    "RoleArn": f"arn:aws:iam::{ACCOUNT}:role/SageMakerTraining",
    "OutputDataConfig": {"S3OutputPath": "s3://team-a-models/output"},
    "ResourceConfig": {"VolumeSizeInGB": 200, "KeepAlivePeriodInSeconds": 0},
    "StoppingCondition": {"MaxRuntimeInSeconds": 86400, "MaxPendingTimeInSeconds": 7200},
    "HyperParameters": {"epochs": "3", "lr": "0.0002"},
    "CheckpointConfig": {"S3Uri": "s3://team-a-models/ignored", "LocalPath": "/opt/ml/checkpoints"},
    "Environment": {"WANDB_PROJECT": "llm"},
    "Tags": [{"Key": "team", "Value": "a"}],
}
"""A realistic CreateTrainingJob request without the fields the placement fills in."""


def attempt(**changes: Any) -> AttemptSpec:
    """An on-demand attempt of a job with the training request above; ``changes`` override."""
    fields: dict[str, Any] = {
        "job_id": 42,
        "job_name": "llm-finetune",
        "attempt": 1,
        "share": "qs1",
        "instance_type": "ml.g5.12xlarge",
        "count": 2,
        "gpus": 4,
        "checkpoint_uri": "s3://team-a-models/checkpoints/42",
        "training": copy.deepcopy(TRAINING),
    }
    fields.update(changes)
    return AttemptSpec(**fields)


def our_tags(spec: AttemptSpec) -> list[dict[str, str]]:
    return [
        {"Key": "team", "Value": "a"},
        {"Key": "airflow-quota:job-id", "Value": str(spec.job_id)},
        {"Key": "airflow-quota:attempt", "Value": str(spec.attempt)},
        {"Key": "airflow-quota:share", "Value": spec.share},
    ]


@pytest.fixture
def client() -> Any:
    """A real SageMaker client that never reaches the network (the Stubber answers)."""
    return boto3.client("sagemaker", region_name=REGION, aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture
def stubber(client: Any) -> Iterator[Stubber]:
    with Stubber(client) as stub:
        yield stub
        stub.assert_no_pending_responses()


def expect_not_found(stub: Stubber, name: str) -> None:
    stub.add_client_error(
        "describe_training_job",
        service_error_code="ValidationException",
        service_message=NOT_FOUND,
        http_status_code=400,
        expected_params={"TrainingJobName": name},
    )


def description(name: str, status: str, secondary: str, **extra: Any) -> dict[str, Any]:
    """A DescribeTrainingJob response with its required members (the Stubber checks them)."""
    return {
        "TrainingJobName": name,
        "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{name}",
        "ModelArtifacts": {"S3ModelArtifacts": f"s3://team-a-models/output/{name}/output/model.tar.gz"},
        "TrainingJobStatus": status,
        "SecondaryStatus": secondary,
        "StoppingCondition": {"MaxRuntimeInSeconds": 86400},
        "CreationTime": datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc),
        **extra,
    }


# -- names ---------------------------------------------------------------------------------------


def test_the_backend_satisfies_the_backend_protocol() -> None:
    backend: Backend = SageMakerBackend(region_name=REGION)
    assert backend.name == "sagemaker"


def test_job_names_are_deterministic_valid_and_keep_the_attempt_key() -> None:
    spec = attempt()
    assert training_job_name("quota", spec) == "quota-llm-finetune-42-1"
    assert training_job_name("quota", spec) == training_job_name("quota", attempt())
    assert training_job_name("quota", attempt(attempt=2)) != training_job_name("quota", spec)


@pytest.mark.parametrize(
    ("prefix", "job_name"),
    [
        pytest.param("quota", "a" * 200, id="a very long job name is shortened"),
        pytest.param("quota", "Team A / LLM fine-tune (v2)!", id="spaces and symbols become hyphens"),
        pytest.param("-prod_", "_x_", id="names never start or end with a hyphen"),
        pytest.param("quota", "!!!", id="a job name with no letters leaves prefix and key"),
        pytest.param("q" * 32, "b" * 100, id="the longest prefix still leaves room for the key"),
    ],
)
def test_job_names_match_sagemakers_pattern_and_length(prefix: str, job_name: str) -> None:
    spec = attempt(job_id=123456789, attempt=17, job_name=job_name)
    name = training_job_name(prefix, spec)
    assert NAME_PATTERN.match(name), name
    assert len(name) <= 63
    assert name.endswith("-123456789-17")


def test_long_job_names_that_share_a_beginning_stay_distinct() -> None:
    one = training_job_name("quota", attempt(job_name="x" * 80 + "one"))
    two = training_job_name("quota", attempt(job_name="x" * 80 + "two"))
    assert one != two


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"name_prefix": "--"}, "letter or digit", id="a prefix with no letter or digit"),
        pytest.param({"name_prefix": "p" * 33}, "longer than 32", id="a prefix leaving no room for the key"),
        pytest.param({"capacity_backoff_seconds": -1}, "capacity_backoff_seconds", id="a negative back-off"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SageMakerBackend(**kwargs)


# -- request shapes, validated by botocore's model -------------------------------------------------


def test_on_demand_create_request_fills_the_placement_and_keeps_the_rest(client: Any, stubber: Stubber) -> None:
    spec = attempt()
    name = "quota-llm-finetune-42-1"
    expected = {
        **copy.deepcopy(TRAINING),
        "TrainingJobName": name,
        "ResourceConfig": {
            "VolumeSizeInGB": 200,
            "KeepAlivePeriodInSeconds": 0,
            "InstanceType": "ml.g5.12xlarge",
            "InstanceCount": 2,
        },
        "CheckpointConfig": {"S3Uri": "s3://team-a-models/checkpoints/42", "LocalPath": "/opt/ml/checkpoints"},
        "Tags": our_tags(spec),
    }
    expect_not_found(stubber, name)
    stubber.add_response(
        "create_training_job",
        {"TrainingJobArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{name}"},
        expected_params=expected,
    )
    SageMakerBackend(client=client).start(spec)


def test_plan_create_request_sets_the_training_plan_arn(client: Any, stubber: Stubber) -> None:
    training = copy.deepcopy(TRAINING)
    del training["CheckpointConfig"]
    spec = attempt(
        instance_type="ml.p5.48xlarge",
        count=1,
        gpus=8,
        training_plan="p5-week",
        training_plan_arn=PLAN_ARN,
        checkpoint_uri=None,
        training=training,
    )
    name = "quota-llm-finetune-42-1"
    expected = {
        **copy.deepcopy(training),
        "TrainingJobName": name,
        "ResourceConfig": {
            "VolumeSizeInGB": 200,
            "KeepAlivePeriodInSeconds": 0,
            "InstanceType": "ml.p5.48xlarge",
            "InstanceCount": 1,
            "TrainingPlanArn": PLAN_ARN,
        },
        "Tags": our_tags(spec),
    }
    expect_not_found(stubber, name)
    stubber.add_response("create_training_job", {"TrainingJobArn": "arn:x"}, expected_params=expected)
    SageMakerBackend(client=client).start(spec)


def test_an_on_demand_entry_drops_a_plan_left_in_the_request(client: Any, stubber: Stubber) -> None:
    training = copy.deepcopy(TRAINING)
    training["ResourceConfig"]["TrainingPlanArn"] = PLAN_ARN
    request = SageMakerBackend(client=client).build_request(attempt(training=training))
    assert "TrainingPlanArn" not in request["ResourceConfig"]


def test_the_callers_training_request_is_not_mutated(client: Any, stubber: Stubber) -> None:
    spec = attempt(training_plan="p5-week", training_plan_arn=PLAN_ARN)
    before = copy.deepcopy(spec.training)
    nested = spec.training["ResourceConfig"]
    expect_not_found(stubber, "quota-llm-finetune-42-1")
    stubber.add_response("create_training_job", {"TrainingJobArn": "arn:x"})
    SageMakerBackend(client=client).start(spec)
    assert spec.training == before
    assert spec.training["ResourceConfig"] is nested
    assert nested == {"VolumeSizeInGB": 200, "KeepAlivePeriodInSeconds": 0}


@pytest.mark.parametrize(
    ("breakage", "named"),
    [
        pytest.param(
            lambda t: t.update(AlgorithmSpec=t.pop("AlgorithmSpecification")),
            'Unknown parameter in input: "AlgorithmSpec"',
            id="AlgorithmSpecification misspelt",
        ),
        pytest.param(lambda t: t.pop("RoleArn"), 'Missing required parameter in input: "RoleArn"', id="no RoleArn"),
        pytest.param(
            lambda t: t["ResourceConfig"].update(VolumeSizeInGB="200"),
            "Invalid type for parameter ResourceConfig.VolumeSizeInGB",
            id="a volume size given as a string",
        ),
        pytest.param(
            lambda t: t["StoppingCondition"].update(MaxPendingTimeInSeconds=600),
            "valid min value: 1800",
            id="a max pending time under SageMaker's minimum",
        ),
    ],
)
def test_an_invalid_training_request_is_refused_by_botocores_model(
    client: Any, stubber: Stubber, breakage: Any, named: str
) -> None:
    """Refused before any call (the Stubber has nothing queued, so a call would fail otherwise).

    botocore 1.44.8's model makes AlgorithmSpecification optional (only TrainingJobName,
    RoleArn and OutputDataConfig are required), so a request merely *missing* it passes
    client-side validation; a misspelt key, as here, is refused.
    """
    training = copy.deepcopy(TRAINING)
    breakage(training)
    with pytest.raises(BackendError) as caught:
        SageMakerBackend(client=client).start(attempt(training=training))
    message = str(caught.value)
    assert "'quota-llm-finetune-42-1'" in message
    assert "not a valid CreateTrainingJob request" in message
    assert named in message


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param(
            {"training": {**copy.deepcopy(TRAINING), "ResourceConfig": {"InstancePreferences": []}}},
            "InstancePreferences is not allowed",
            id="a preference list inside the request",
        ),
        pytest.param({"training_plan": "p5-week"}, "has no ARN", id="a plan entry without its ARN"),
        pytest.param({"checkpoint_uri": "/tmp/ckpt"}, "not an S3 URI", id="a local checkpoint directory"),
    ],
)
def test_requests_the_placement_cannot_fill_are_refused(client: Any, changes: dict[str, Any], message: str) -> None:
    with pytest.raises(BackendError, match=message):
        SageMakerBackend(client=client).start(attempt(**changes))


def test_start_of_an_existing_job_creates_nothing(client: Any, stubber: Stubber) -> None:
    name = "quota-llm-finetune-42-1"
    stubber.add_response(
        "describe_training_job", description(name, "InProgress", "Training"), expected_params={"TrainingJobName": name}
    )
    SageMakerBackend(client=client).start(attempt())  # no create_training_job queued: none is made


@pytest.mark.parametrize(
    ("code", "message"),
    [
        pytest.param("ResourceInUse", "Training job names must be unique", id="ResourceInUse"),
        pytest.param("ValidationException", "A training job with this name already exists", id="already exists"),
    ],
)
def test_a_create_racing_an_earlier_one_is_harmless(client: Any, stubber: Stubber, code: str, message: str) -> None:
    name = "quota-llm-finetune-42-1"
    expect_not_found(stubber, name)
    stubber.add_client_error("create_training_job", service_error_code=code, service_message=message)
    SageMakerBackend(client=client).start(attempt())


def test_a_failed_create_names_the_training_job_and_keeps_the_cause(client: Any, stubber: Stubber) -> None:
    expect_not_found(stubber, "quota-llm-finetune-42-1")
    stubber.add_client_error(
        "create_training_job",
        service_error_code="ResourceLimitExceeded",
        service_message="The account-level service limit 'ml.g5.12xlarge for training job usage' is 0 Instances",
    )
    with pytest.raises(BackendError, match=r"CreateTrainingJob for training job 'quota-llm-finetune-42-1'") as caught:
        SageMakerBackend(client=client).start(attempt())
    assert isinstance(caught.value.__cause__, ClientError)
    assert "ResourceLimitExceeded" in str(caught.value)


def test_a_failed_describe_names_the_training_job(client: Any, stubber: Stubber) -> None:
    stubber.add_client_error("describe_training_job", service_error_code="ThrottlingException", http_status_code=400)
    with pytest.raises(BackendError, match=r"DescribeTrainingJob for training job 'quota-llm-finetune-42-1'") as caught:
        SageMakerBackend(client=client).poll(attempt())
    assert isinstance(caught.value.__cause__, ClientError)


# -- stop (moto has no StopTrainingJob: the Stubber covers it) -------------------------------------


def test_stop_then_poll_reports_stopped(client: Any, stubber: Stubber) -> None:
    name = "quota-llm-finetune-42-1"
    stubber.add_response("stop_training_job", {}, expected_params={"TrainingJobName": name})
    stubber.add_response(
        "describe_training_job",
        description(name, "Stopping", "Stopping", TrainingStartTime=datetime(2026, 11, 1, 12, 5, tzinfo=timezone.utc)),
    )
    stubber.add_response("describe_training_job", description(name, "Stopped", "Stopped"))
    backend = SageMakerBackend(client=client)
    backend.stop(attempt(), grace_seconds=300)
    assert backend.poll(attempt()).status is AttemptStatus.RUNNING  # still checkpointing: capacity held
    assert backend.poll(attempt()).status is AttemptStatus.STOPPED


def test_stop_of_a_job_no_longer_in_progress_is_harmless(client: Any, stubber: Stubber) -> None:
    name = "quota-llm-finetune-42-1"
    stubber.add_client_error(
        "stop_training_job",
        service_error_code="ValidationException",
        service_message="The request was rejected because the training job is in status Completed.",
    )
    stubber.add_response("describe_training_job", description(name, "Completed", "Completed"))
    SageMakerBackend(client=client).stop(attempt(), grace_seconds=0)


def test_stop_of_a_job_never_started_is_harmless(client: Any, stubber: Stubber) -> None:
    stubber.add_client_error("stop_training_job", service_error_code="ValidationException", service_message=NOT_FOUND)
    SageMakerBackend(client=client).stop(attempt(), grace_seconds=0)


def test_a_throttled_create_or_stop_is_backend_throttled_so_the_scheduler_makes_it_again(
    client: Any, stubber: Stubber
) -> None:
    """Not a failed start (START_FAILED) nor a stop given up: the poller pauses and asks again."""
    name = "quota-llm-finetune-42-1"
    expect_not_found(stubber, name)
    stubber.add_client_error("create_training_job", service_error_code="ThrottlingException", http_status_code=400)
    stubber.add_client_error("stop_training_job", service_error_code="ThrottlingException", http_status_code=400)
    backend = SageMakerBackend(client=client)
    with pytest.raises(BackendThrottled, match=r"CreateTrainingJob for training job 'quota-llm-finetune-42-1'"):
        backend.start(attempt())
    with pytest.raises(BackendThrottled, match=r"StopTrainingJob for training job 'quota-llm-finetune-42-1'"):
        backend.stop(attempt(), grace_seconds=0)
    assert (backend.calls_per_start, backend.calls_per_stop) == (2, 1), "what each costs in the rate"


def test_a_refused_stop_of_a_running_job_is_an_error(client: Any, stubber: Stubber) -> None:
    name = "quota-llm-finetune-42-1"
    stubber.add_client_error(
        "stop_training_job", service_error_code="ValidationException", service_message="Something else is wrong."
    )
    stubber.add_response("describe_training_job", description(name, "InProgress", "Training"))
    with pytest.raises(BackendError, match=r"StopTrainingJob for training job 'quota-llm-finetune-42-1'") as caught:
        SageMakerBackend(client=client).stop(attempt(), grace_seconds=0)
    assert isinstance(caught.value.__cause__, ClientError)


def test_a_denied_stop_is_an_error(client: Any, stubber: Stubber) -> None:
    stubber.add_client_error("stop_training_job", service_error_code="AccessDeniedException", http_status_code=403)
    with pytest.raises(BackendError, match="AccessDeniedException"):
        SageMakerBackend(client=client).stop(attempt(), grace_seconds=0)


# -- listing the changes -----------------------------------------------------------------------


def summary(name: str, status: str, modified: datetime, secondary: str | None = None) -> dict[str, Any]:
    """A ListTrainingJobs summary with its required members (the Stubber checks them)."""
    out: dict[str, Any] = {
        "TrainingJobName": name,
        "TrainingJobArn": f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:training-job/{name}",
        "CreationTime": datetime(2026, 11, 1, 12, 0, tzinfo=timezone.utc),
        "LastModifiedTime": modified,
        "TrainingJobStatus": status,
    }
    if secondary is not None:
        out["SecondaryStatus"] = secondary
    return out


def test_changed_since_lists_the_jobs_modified_after_a_moment_page_by_page(client: Any, stubber: Stubber) -> None:
    """LastModifiedTimeAfter, this backend's name prefix and 100 a page; NextToken followed one page
    a call; a job not among the attempts is left out; the summary shows PENDING or RUNNING only
    when its SecondaryStatus says so (an ended job's outcome needs DescribeTrainingJob)."""
    since = datetime(2026, 11, 1, 13, 0, tzinfo=timezone.utc)
    modified = datetime(2026, 11, 1, 13, 5, tzinfo=timezone.utc)
    asked = {"LastModifiedTimeAfter": since, "NameContains": "quota-", "MaxResults": 100}
    stubber.add_response(
        "list_training_jobs",
        {
            "TrainingJobSummaries": [
                summary("quota-llm-finetune-1-1", "InProgress", modified, "Training"),
                summary("quota-someone-elses-9-1", "Completed", modified, "Completed"),
                summary("quota-llm-finetune-2-1", "InProgress", modified, "Downloading"),
            ],
            "NextToken": "page-2",
        },
        asked,
    )
    stubber.add_response(
        "list_training_jobs",
        {"TrainingJobSummaries": [summary("quota-llm-finetune-3-1", "Failed", modified, "Failed")]},
        {**asked, "NextToken": "page-2"},
    )
    backend = SageMakerBackend(client=client)
    attempts = [attempt(job_id=job_id) for job_id in (1, 2, 3, 4)]
    first = backend.changed_since(attempts, since.timestamp(), None)
    assert first.changed == {
        (1, 1): ListedChange(modified.timestamp(), AttemptStatus.RUNNING),
        (2, 1): ListedChange(modified.timestamp(), AttemptStatus.PENDING),
    }
    assert first.next_page is not None
    second = backend.changed_since(attempts, since.timestamp(), first.next_page)
    assert second.changed == {(3, 1): ListedChange(modified.timestamp(), None)}
    assert second.next_page is None


def test_a_throttled_or_failed_listing_is_a_backend_error(client: Any, stubber: Stubber) -> None:
    stubber.add_client_error("list_training_jobs", service_error_code="ThrottlingException", http_status_code=400)
    stubber.add_client_error("list_training_jobs", service_error_code="AccessDeniedException", http_status_code=403)
    backend = SageMakerBackend(client=client)
    with pytest.raises(BackendThrottled, match="ListTrainingJobs throttled"):
        backend.changed_since([attempt()], 0.0, None)
    with pytest.raises(BackendError, match=r"ListTrainingJobs failed.*AccessDeniedException"):
        backend.changed_since([attempt()], 0.0, None)


# -- the status mapping table -------------------------------------------------------------------

STARTED = datetime(2026, 11, 1, 12, 10, tzinfo=timezone.utc)
ENDED = datetime(2026, 11, 1, 14, 0, tzinfo=timezone.utc)
CAPACITY_REASON = (
    "CapacityError: Unable to provision requested ML compute capacity. Please retry using a different ML instance type."
)


def transitions(*pairs: tuple[str, str]) -> dict[str, Any]:
    return {
        "SecondaryStatusTransitions": [
            {"Status": status, "StartTime": STARTED, "StatusMessage": message} for status, message in pairs
        ]
    }


@pytest.mark.parametrize(
    ("status", "secondary", "extra", "expected", "reason"),
    [
        pytest.param("InProgress", "Starting", {}, AttemptStatus.PENDING, "Starting", id="starting is pending"),
        pytest.param(
            "InProgress", "Pending", {}, AttemptStatus.PENDING, "Pending", id="waiting for capacity is pending"
        ),
        pytest.param(
            "InProgress",
            "LaunchingMLInstances",
            transitions(("LaunchingMLInstances", "Launching requested ML instances")),
            AttemptStatus.PENDING,
            "LaunchingMLInstances: Launching requested ML instances",
            id="launching instances is pending",
        ),
        pytest.param(
            "InProgress",
            "PreparingTrainingStack",
            {},
            AttemptStatus.PENDING,
            None,
            id="preparing the training stack is pending",
        ),
        pytest.param("InProgress", "Downloading", {}, AttemptStatus.PENDING, None, id="downloading data is pending"),
        pytest.param(
            "InProgress", "DownloadingTrainingImage", {}, AttemptStatus.PENDING, None, id="pulling the image is pending"
        ),
        pytest.param(
            "InProgress",
            "Training",
            {"TrainingStartTime": STARTED},
            AttemptStatus.RUNNING,
            None,
            id="training is running since TrainingStartTime",
        ),
        pytest.param(
            "InProgress",
            "Uploading",
            {"TrainingStartTime": STARTED},
            AttemptStatus.RUNNING,
            None,
            id="uploading the model is running",
        ),
        pytest.param(
            "InProgress",
            "Updating",
            {"TrainingStartTime": STARTED},
            AttemptStatus.RUNNING,
            None,
            id="updating is running",
        ),
        pytest.param(
            "InProgress",
            "Restarting",
            {"TrainingStartTime": STARTED},
            AttemptStatus.RUNNING,
            None,
            id="restarting after training began is running",
        ),
        pytest.param(
            "InProgress",
            "SomeFutureStatus",
            {"TrainingStartTime": STARTED},
            AttemptStatus.RUNNING,
            None,
            id="an unknown secondary status after training began is running",
        ),
        pytest.param(
            "InProgress",
            "SomeFutureStatus",
            {},
            AttemptStatus.PENDING,
            None,
            id="an unknown secondary status before training is pending",
        ),
        pytest.param(
            "Stopping",
            "Stopping",
            {"TrainingStartTime": STARTED},
            AttemptStatus.RUNNING,
            "Stopping",
            id="stopping after training began still holds its capacity",
        ),
        pytest.param(
            "Stopping",
            "Stopping",
            {},
            AttemptStatus.PENDING,
            "Stopping",
            id="stopping before training began is still pending",
        ),
        pytest.param(
            "Completed",
            "Completed",
            {"TrainingStartTime": STARTED, "TrainingEndTime": ENDED},
            AttemptStatus.SUCCEEDED,
            None,
            id="completed succeeded",
        ),
        pytest.param(
            "Failed",
            "Failed",
            {"FailureReason": "AlgorithmError: ExecuteUserScriptError: exit code 1", "TrainingEndTime": ENDED},
            AttemptStatus.FAILED,
            "AlgorithmError: ExecuteUserScriptError: exit code 1",
            id="an algorithm failure fails with SageMaker's reason",
        ),
        pytest.param(
            "Failed", "Failed", {}, AttemptStatus.FAILED, "Failed", id="a failure without a reason still fails"
        ),
        pytest.param(
            "Failed",
            "Failed",
            {"FailureReason": CAPACITY_REASON},
            AttemptStatus.CAPACITY_ERROR,
            "CapacityError",
            id="a CapacityError failure is a capacity error",
        ),
        pytest.param(
            "Failed",
            "Failed",
            {"FailureReason": "InsufficientCapacityError: no ml.p5.48xlarge capacity within MaxPendingTimeInSeconds"},
            AttemptStatus.CAPACITY_ERROR,
            "InsufficientCapacityError",
            id="an InsufficientCapacityError failure is a capacity error",
        ),
        pytest.param(
            "Stopped",
            "Stopped",
            {"TrainingStartTime": STARTED, "TrainingEndTime": ENDED},
            AttemptStatus.STOPPED,
            "Stopped",
            id="stopped on request is stopped",
        ),
        pytest.param(
            "Stopped",
            "Stopped",
            transitions(("Pending", "Waiting for capacity"), ("Stopped", "Training job stopped by user")),
            AttemptStatus.STOPPED,
            "Stopped",
            id="a job preempted while it waited for capacity is stopped",
        ),
        pytest.param(
            "Stopped",
            "Stopped",
            transitions(("Stopped", "Training job timed out in pending waiting for capacity")),
            AttemptStatus.CAPACITY_ERROR,
            "waiting for capacity",
            id="stopped after timing out waiting for capacity is a capacity error",
        ),
        pytest.param(
            "Stopped",
            "Stopped",
            {"FailureReason": CAPACITY_REASON},
            AttemptStatus.CAPACITY_ERROR,
            "CapacityError",
            id="stopped with a CapacityError reason is a capacity error",
        ),
        pytest.param(
            "Stopped",
            "MaxWaitTimeExceeded",
            {},
            AttemptStatus.CAPACITY_ERROR,
            "MaxWaitTimeExceeded",
            id="spot capacity that never came is a capacity error",
        ),
        pytest.param(
            "Stopped",
            "Interrupted",
            {"TrainingStartTime": STARTED},
            AttemptStatus.CAPACITY_ERROR,
            "Interrupted",
            id="spot capacity taken back is a capacity error",
        ),
        pytest.param(
            "Stopped",
            "MaxRuntimeExceeded",
            {"TrainingStartTime": STARTED},
            AttemptStatus.FAILED,
            "MaxRuntimeExceeded",
            id="running out of its own max runtime is a failure, not a preemption",
        ),
        pytest.param(
            "Deleting", "Completed", {}, AttemptStatus.STOPPED, "Deleting", id="a job being deleted is stopped"
        ),
    ],
)
def test_status_mapping(
    client: Any,
    stubber: Stubber,
    status: str,
    secondary: str,
    extra: dict[str, Any],
    expected: AttemptStatus,
    reason: str | None,
) -> None:
    name = "quota-llm-finetune-42-1"
    stubber.add_response(
        "describe_training_job",
        description(name, status, secondary, **extra),
        expected_params={"TrainingJobName": name},
    )
    report = SageMakerBackend(client=client).poll(attempt())
    assert report.status is expected
    if reason is not None:
        assert report.reason is not None
        assert reason in report.reason
    if "TrainingStartTime" in extra and expected is not AttemptStatus.PENDING:
        assert report.running_since == STARTED.timestamp()
    if expected is AttemptStatus.RUNNING and "TrainingStartTime" not in extra:
        assert report.running_since is None
    if "TrainingEndTime" in extra:
        assert report.ended_at == ENDED.timestamp()
    assert report.status.ended == (expected not in (AttemptStatus.PENDING, AttemptStatus.RUNNING))


@pytest.mark.parametrize(
    ("code", "message"),
    [
        pytest.param("ValidationException", NOT_FOUND, id="SageMaker's requested resource not found"),
        pytest.param("ResourceNotFound", "Training job not found", id="the ResourceNotFound code of the model"),
    ],
)
def test_poll_of_an_unknown_job_is_unknown(client: Any, stubber: Stubber, code: str, message: str) -> None:
    stubber.add_client_error("describe_training_job", service_error_code=code, service_message=message)
    assert SageMakerBackend(client=client).poll(attempt()).status is AttemptStatus.UNKNOWN


def test_an_unknown_training_job_status_is_an_error(client: Any, stubber: Stubber) -> None:
    stubber.add_response("describe_training_job", description("quota-llm-finetune-42-1", "Hibernating", "Training"))
    with pytest.raises(BackendError, match="'Hibernating'"):
        SageMakerBackend(client=client).poll(attempt())


# -- against a real moto server ------------------------------------------------------------------


def test_moto_create_describe_and_status(moto_url: str) -> None:
    backend = SageMakerBackend(region_name=REGION, endpoint_url=moto_url)
    spec = attempt(job_id=1001)
    assert backend.poll(spec).status is AttemptStatus.UNKNOWN
    started = backend.start(spec)

    stored = backend.client.describe_training_job(TrainingJobName=backend.job_name(spec))
    assert (started.name, started.arn) == (stored["TrainingJobName"], stored["TrainingJobArn"])
    assert backend.start(spec) == started  # started again: found, with the same name and ARN
    assert stored["TrainingJobName"] == "quota-llm-finetune-1001-1"
    assert stored["ResourceConfig"] == {
        "VolumeSizeInGB": 200,
        "KeepAlivePeriodInSeconds": 0,
        "InstanceType": "ml.g5.12xlarge",
        "InstanceCount": 2,
    }
    assert stored["CheckpointConfig"] == {
        "S3Uri": "s3://team-a-models/checkpoints/42",
        "LocalPath": "/opt/ml/checkpoints",
    }
    assert stored["StoppingCondition"] == TRAINING["StoppingCondition"]
    assert stored["HyperParameters"] == TRAINING["HyperParameters"]

    report = backend.poll(spec)  # moto completes every training job at once
    assert report.status is AttemptStatus.SUCCEEDED
    assert report.running_since is not None
    assert report.ended_at is not None


def test_moto_plan_entry_stores_the_training_plan_arn(moto_url: str) -> None:
    """moto does not validate TrainingPlanArn; it stores and echoes it, which shows what was sent."""
    backend = SageMakerBackend(region_name=REGION, endpoint_url=moto_url)
    spec = attempt(job_id=1002, instance_type="ml.p5.48xlarge", count=1, training_plan="p5", training_plan_arn=PLAN_ARN)
    backend.start(spec)
    stored = backend.client.describe_training_job(TrainingJobName=backend.job_name(spec))
    assert stored["ResourceConfig"]["TrainingPlanArn"] == PLAN_ARN
    assert stored["ResourceConfig"]["InstanceType"] == "ml.p5.48xlarge"


def test_moto_start_twice_creates_once_even_after_a_restart(moto_url: str) -> None:
    """moto replaces a job created again under the same name (real SageMaker answers
    ResourceInUse), so counting the CreateTrainingJob calls is what shows idempotence."""
    creates: list[str] = []

    def count(params: dict[str, Any], **_: Any) -> None:
        creates.append(params["TrainingJobName"])

    spec = attempt(job_id=1003)
    first = SageMakerBackend(region_name=REGION, endpoint_url=moto_url)
    first.client.meta.events.register("before-parameter-build.sagemaker.CreateTrainingJob", count)
    first.start(spec)
    created = first.client.describe_training_job(TrainingJobName=first.job_name(spec))["CreationTime"]
    first.start(spec)

    restarted = SageMakerBackend(region_name=REGION, endpoint_url=moto_url)  # a scheduler after a crash
    restarted.client.meta.events.register("before-parameter-build.sagemaker.CreateTrainingJob", count)
    restarted.start(spec)

    assert creates == ["quota-llm-finetune-1003-1"]
    assert restarted.client.describe_training_job(TrainingJobName=first.job_name(spec))["CreationTime"] == created


def test_moto_poll_of_an_attempt_never_started_is_unknown(moto_url: str) -> None:
    """moto's message differs from SageMaker's ("Could not find training job '…'")."""
    backend = SageMakerBackend(region_name=REGION, endpoint_url=moto_url)
    assert backend.poll(attempt(job_id=1004, attempt=9)).status is AttemptStatus.UNKNOWN


def test_moto_has_no_stop_training_job_and_the_error_names_the_job(moto_url: str) -> None:
    """moto 5.2.5 answers StopTrainingJob with a 500 (NotImplementedError); the stop path and
    STOPPED are covered by the Stubber tests above. This shows a server failure becomes a
    BackendError naming the training job."""
    client = boto3.client(
        "sagemaker", region_name=REGION, endpoint_url=moto_url, config=Config(retries={"max_attempts": 1})
    )
    backend = SageMakerBackend(client=client)
    spec = attempt(job_id=1005)
    backend.start(spec)
    with pytest.raises(BackendError, match=r"StopTrainingJob for training job 'quota-llm-finetune-1005-1'"):
        backend.stop(spec, grace_seconds=60)


# -- credentials per AWS connection ----------------------------------------------------------------


def team_connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, key: str, region: str, url: str) -> None:
    monkeypatch.setenv(
        f"AIRFLOW_CONN_{conn_id.upper()}",
        json.dumps(
            {
                "conn_type": "aws",
                "login": key,
                "password": f"secret-of-{key}",
                "extra": {"region_name": region, "endpoint_url": url},
            }
        ),
    )


def test_each_job_runs_with_its_aws_connections_credentials(moto_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    team_connection(monkeypatch, "aws_team_a", "AKIATEAMAAAAAAAAAAAA", "eu-west-1", moto_url)
    team_connection(monkeypatch, "aws_team_b", "AKIATEAMBBBBBBBBBBBB", "us-west-2", moto_url)
    backend = SageMakerBackend(region_name=REGION, endpoint_url=moto_url)
    a, b, own = (
        attempt(job_id=2001, aws_conn_id="aws_team_a"),
        attempt(job_id=2002, aws_conn_id="aws_team_b"),
        attempt(),
    )

    for spec, key, region in ((a, "AKIATEAMAAAAAAAAAAAA", "eu-west-1"), (b, "AKIATEAMBBBBBBBBBBBB", "us-west-2")):
        client = backend.client_for(spec)
        assert client.meta.region_name == region
        assert client._request_signer._credentials.get_frozen_credentials().access_key == key
        assert backend.client_for(spec) is client  # one client per connection
    assert backend.client_for(own) is backend.client
    assert backend.client.meta.region_name == REGION

    started = backend.start(a)  # created in team A's region, with team A's credentials
    assert started.arn is not None and ":eu-west-1:" in started.arn
    assert backend.poll(a).status is AttemptStatus.SUCCEEDED
    assert backend.poll(attempt(job_id=2001)).status is AttemptStatus.UNKNOWN  # not in the scheduler's region


def test_an_unknown_aws_connection_is_a_backend_error_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_AWS_NOBODY", raising=False)
    with pytest.raises(BackendError, match="AWS connection 'aws_nobody': cannot build a SageMaker client"):
        SageMakerBackend(region_name=REGION).client_for(attempt(aws_conn_id="aws_nobody"))


def test_moto_lists_the_jobs_modified_after_a_moment(moto_url: str) -> None:
    """moto 5.2.5 filters ListTrainingJobs by LastModifiedTimeAfter and NameContains (its
    summaries have no SecondaryStatus, so every job listed is described)."""
    backend = SageMakerBackend(region_name=REGION, endpoint_url=moto_url, name_prefix="listing")
    spec = attempt(job_id=1006)
    before = time.time() - 5.0
    backend.start(spec)
    page = backend.changed_since([spec, attempt(job_id=1007)], before, None)
    assert set(page.changed) == {(1006, 1)}
    assert page.changed[1006, 1].status is None
    assert backend.changed_since([spec], time.time() + 5.0, None).changed == {}
