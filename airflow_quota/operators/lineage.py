"""OpenLineage facets of a quota training, for the ``apache-airflow-providers-openlineage``
listener (``QuotaTrainingOperator.get_openlineage_facets_on_start/complete/failure``).

What the amazon provider's ``SageMakerTrainingOperator`` reports, and the quota's side of it:

- **sagemaker backend**: the inputs are the S3 URIs of the request's ``InputDataConfig``
  (known at start), the output the successful training job's ``ModelArtifacts.S3ModelArtifacts``
  (at completion), each as a dataset ``s3://<bucket>`` / ``<key>`` as the provider names them.
- **both backends**: a ``quotaJob`` run facet (``QuotaJobRunFacet``): the quota job's id, name,
  share and state, where it ran (instance type and count, training plan, instances borrowed),
  attempts, preemptions, GPU-hours used and lost, cost, seconds waited, and the failure's
  reason code.
- **local backend**: no datasets of its own (the command's reads and writes are not known to
  the operator); the task's ``inlets``/``outlets`` then stand for them, as the provider adds a
  task's declared inlets and outlets when an operator reports none.

``checkpoint_uri`` is not an output dataset: checkpoints are the training's scratch state,
read back only by the same job after a preemption, not a product anyone downstream consumes;
as a dataset it would show every training writing (and a resumed one reading) a dataset nobody
else uses. It is in the run facet instead (``checkpointUri``), where someone looking for it finds it.

This module imports the OpenLineage provider at its top: the operator imports it only inside
its ``get_openlineage_facets_*`` methods, which only that provider calls, so the operator
works without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.providers.common.compat.openlineage.facet import Dataset, RunFacet
from airflow.providers.openlineage.extractors import OperatorLineage
from attrs import define

from airflow_quota.operators.arguments import rendered_as

RUN_FACET = "quotaJob"
"""The key of ``QuotaJobRunFacet`` among a run event's facets."""


@define
class QuotaJobRunFacet(RunFacet):
    """The quota job behind a training task's run: where it ran, what it cost, how it ended (fields in
    camelCase, as OpenLineage's own facets)."""

    jobId: int
    jobName: str
    share: str
    state: str
    backend: str
    reason: str | None = None
    instanceType: str | None = None
    instanceCount: int | None = None
    trainingPlan: str | None = None
    borrowed: int = 0
    attempts: int = 0
    preemptions: int = 0
    gpuHours: float = 0.0
    lostGpuHours: float = 0.0
    cost: float = 0.0
    waitSeconds: float = 0.0
    checkpointUri: str | None = None
    trainingJob: str | None = None
    """The SageMaker training job of the last attempt (sagemaker backend)."""


def s3_dataset(uri: str) -> Dataset:
    """A dataset of an S3 URI, named as the amazon provider names it: namespace ``s3://<bucket>``,
    name the key (``/`` for the bucket itself)."""
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return Dataset(namespace=f"s3://{bucket}", name=key or "/", facets={})


def request_inputs(training_request: Any) -> list[Dataset]:
    """The S3 inputs of a CreateTrainingJob request's ``InputDataConfig`` (channels read from
    EFS or FSx have no S3 URI and are left out)."""
    request = rendered_as(training_request, dict)
    if not isinstance(request, Mapping):
        return []
    inputs = []
    for channel in request.get("InputDataConfig") or []:
        source = channel.get("DataSource", {}).get("S3DataSource", {}) if isinstance(channel, Mapping) else {}
        uri = source.get("S3Uri") if isinstance(source, Mapping) else None
        if isinstance(uri, str) and uri.startswith("s3://"):
            inputs.append(s3_dataset(uri))
    return inputs


def model_outputs(description: Mapping[str, Any] | None) -> list[Dataset]:
    """The model artifacts a successful SageMaker training job wrote (DescribeTrainingJob)."""
    uri = ((description or {}).get("ModelArtifacts") or {}).get("S3ModelArtifacts")
    return [s3_dataset(uri)] if isinstance(uri, str) and uri.startswith("s3://") else []


def run_facet(outcome: Mapping[str, Any], backend: str, checkpoint_uri: Any) -> QuotaJobRunFacet:
    """The ``quotaJob`` facet of the job the operator followed (``outcome``: the task's summary,
    ``operators.training.job_summary``, with ``reason`` and ``training_job``)."""
    return QuotaJobRunFacet(
        jobId=outcome["job_id"],
        jobName=outcome["job_name"],
        share=outcome["share"],
        state=outcome["state"],
        backend=backend,
        reason=outcome.get("reason"),
        instanceType=outcome.get("instance_type"),
        instanceCount=outcome.get("instance_count"),
        trainingPlan=outcome.get("training_plan"),
        borrowed=outcome.get("borrowed", 0),
        attempts=outcome.get("attempts", 0),
        preemptions=outcome.get("preemptions", 0),
        gpuHours=outcome.get("gpu_hours", 0.0),
        lostGpuHours=outcome.get("lost_gpu_hours", 0.0),
        cost=outcome.get("cost", 0.0),
        waitSeconds=outcome.get("wait_seconds", 0.0),
        checkpointUri=checkpoint_uri if isinstance(checkpoint_uri, str) else None,
        trainingJob=outcome.get("training_job"),
    )


def lineage_at_start(backend: str, training_request: Any) -> OperatorLineage[Any, Any]:
    """Before the job is submitted: the inputs the request names (sagemaker)."""
    inputs = request_inputs(training_request) if backend == "sagemaker" else []
    return OperatorLineage(inputs=inputs, outputs=[])


def lineage_at_end(
    backend: str,
    training_request: Any,
    checkpoint_uri: Any,
    outcome: Mapping[str, Any] | None,
    description: Mapping[str, Any] | None,
) -> OperatorLineage[Any, Any]:
    """Once the task ends: the inputs, the model written (a successful SageMaker training) and
    the ``quotaJob`` facet (when the task got as far as a quota job)."""
    lineage = lineage_at_start(backend, training_request)
    facets: dict[str, Any] = {} if outcome is None else {RUN_FACET: run_facet(outcome, backend, checkpoint_uri)}
    outputs = model_outputs(description) if backend == "sagemaker" else []
    return OperatorLineage(inputs=lineage.inputs, outputs=outputs, run_facets=facets)
