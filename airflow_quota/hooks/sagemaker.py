"""The SageMaker side of ``QuotaTrainingOperator``, as the amazon provider's
``SageMakerTrainingOperator`` does it, on its ``SageMakerHook``: integers that Jinja rendered
as text cast back, a role name expanded to its ARN, the request checked against botocore's own
model before it is submitted (not hours later, when it is placed), and the finished training
job described for the task's result.

The quota scheduler runs the request later, on the instance type and count it places the job
on; the check here fills the placement with the first entry of the preference list, so every
other field is checked as SageMaker will see it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

from airflow.providers.amazon.aws.hooks.sagemaker import SageMakerHook

from airflow_quota.exceptions import Problem
from airflow_quota.service.backends.base import AttemptSpec, BackendError
from airflow_quota.service.backends.sagemaker import SageMakerBackend, request_problems

INTEGER_FIELDS: tuple[tuple[str, str], ...] = (
    ("ResourceConfig", "VolumeSizeInGB"),
    ("ResourceConfig", "KeepAlivePeriodInSeconds"),
    ("StoppingCondition", "MaxRuntimeInSeconds"),
    ("StoppingCondition", "MaxWaitTimeInSeconds"),
    ("StoppingCondition", "MaxPendingTimeInSeconds"),
)
"""CreateTrainingJob fields that are integers: a rendered ``"200"`` is 200 (the provider's
``integer_fields``, less the instance count, which the placement sets)."""

STAND_IN_NAME = "quota-request-check"


def with_integers(request: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``request`` with the integer fields that hold digits as integers."""
    cast = copy.deepcopy(dict(request))
    for section, field in INTEGER_FIELDS:
        part = cast.get(section)
        if isinstance(part, dict) and isinstance(part.get(field), str) and part[field].strip().isdigit():
            part[field] = int(part[field])
    return cast


def serialize(result: Mapping[str, Any]) -> dict[str, Any]:
    """A boto3 answer as plain JSON values (datetimes as text), as the provider returns it."""
    plain: dict[str, Any] = json.loads(json.dumps(result, default=str))
    return plain


def placed_request_problems(
    request: Mapping[str, Any],
    share: str,
    preferences: Sequence[Mapping[str, Any]],
    checkpoint_uri: str | None,
) -> list[Problem]:
    """What botocore's SageMaker model refuses in ``request`` once the quota scheduler has
    filled in the placement (the first preference, on demand), each as a ``training_request``
    problem naming the field."""
    first = preferences[0]
    stand_in = AttemptSpec(
        job_id=0,
        job_name=STAND_IN_NAME,
        attempt=1,
        share=share,
        instance_type=str(first["instance_type"]),
        count=int(first["count"]),
        gpus=0,
        checkpoint_uri=checkpoint_uri,
        training=dict(request),
    )
    try:
        placed = SageMakerBackend().build_request(stand_in)
    except BackendError as exc:
        return [Problem("training_request", str(exc))]
    return [Problem("training_request", line) for line in request_problems(placed)]


class TrainingJobs:
    """The training jobs of one AWS connection, through the provider's ``SageMakerHook``."""

    def __init__(self, aws_conn_id: str | None) -> None:
        self.aws_conn_id = aws_conn_id

    @cached_property
    def hook(self) -> SageMakerHook:
        return SageMakerHook(aws_conn_id=self.aws_conn_id)  # type: ignore[no-untyped-call]

    def expand_role(self, request: Mapping[str, Any]) -> dict[str, Any]:
        """A copy of ``request`` whose ``RoleArn``, when it is a role name, is that role's ARN."""
        expanded = dict(request)
        role = expanded.get("RoleArn")
        if isinstance(role, str) and role and "/" not in role:
            expanded["RoleArn"] = self.hook.expand_role(role)
        return expanded

    def describe(self, name: str) -> dict[str, Any]:
        """DescribeTrainingJob, as plain JSON values."""
        return serialize(self.hook.describe_training_job(name))

    @property
    def region_name(self) -> str:
        return str(self.hook.conn_region_name)

    @property
    def partition(self) -> str:
        return str(self.hook.conn_partition)
