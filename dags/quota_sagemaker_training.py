"""One SageMaker training, whoever places it: the same DAG on either kind of quota scheduler.

``QuotaTrainingOperator`` with the sagemaker backend submits a CreateTrainingJob request and a
preference list to share ``qs1`` of ``examples/quota.yaml``. Nothing in the DAG says who places
it; that is the quota scheduler's deployment:

- ``airflow-quota scheduler``: airflow-quota places (its shares, reservations, forecasts) and
  starts each attempt as a SageMaker training job on the entry it chose;
- ``airflow-quota scheduler --aws-batch-job-queue quota-queue``: AWS Batch places. The job goes
  to the job queue as a service job (``SubmitServiceJob`` with the whole preference list, the
  share as ``quotaShareName``, the priority, ``preemption_retries``), and what AWS does comes
  back to the same task: its log, the Quotas page, the alerts (docs/aws-batch.md).

Set ``AIRFLOW_QUOTA_EXAMPLE_ROLE_ARN`` and ``AIRFLOW_QUOTA_EXAMPLE_IMAGE`` to a SageMaker
execution role and a training image of your account; the AWS connection is ``aws_default``.
"""

from __future__ import annotations

import os

import pendulum
from airflow.sdk import DAG

from airflow_quota.operators import QuotaTrainingOperator

ROLE_ARN = os.environ.get("AIRFLOW_QUOTA_EXAMPLE_ROLE_ARN", "arn:aws:iam::123456789012:role/SageMakerTraining")
IMAGE = os.environ.get("AIRFLOW_QUOTA_EXAMPLE_IMAGE", "123456789012.dkr.ecr.us-east-1.amazonaws.com/llm-train:1.4")

with DAG(
    dag_id="quota_sagemaker_training",
    schedule=None,
    start_date=pendulum.datetime(2026, 12, 1, tz="UTC"),
    catchup=False,
    tags=["airflow-quota", "sagemaker"],
):
    QuotaTrainingOperator(
        task_id="train",
        share="qs1",
        instance_preferences=[{"instance_type": "ml.g5.xlarge", "count": 1}],
        priority=3,
        preemption_retries=3,
        backend="sagemaker",
        training_request={
            "AlgorithmSpecification": {"TrainingImage": IMAGE, "TrainingInputMode": "File"},
            "RoleArn": ROLE_ARN,
            "OutputDataConfig": {"S3OutputPath": "s3://airflow-quota-example/output/{{ run_id | replace(':', '-') }}"},
            "ResourceConfig": {"VolumeSizeInGB": 50},
            "StoppingCondition": {"MaxRuntimeInSeconds": 3600},
        },
        check_interval=2,
    )
