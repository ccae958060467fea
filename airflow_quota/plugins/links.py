"""The buttons of a ``QuotaTrainingOperator`` task instance: "Quota job", a link to its job's
page, and for the sagemaker backend the training job in the SageMaker console and its logs in
CloudWatch (the amazon provider's ``BaseAwsLink``, stored in XCom when the task ends).

Airflow 3 computes operator links in the worker when the task stops running (after it submits
and defers, and again when it ends) and keeps them in XCom; the UI shows the stored link. The
job's id is the operator's ``job_id`` in that process, or the ``quota_job_id`` XCom it pushed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.providers.amazon.aws.links.base_aws import BASE_AWS_CONSOLE_LINK, BaseAwsLink
from airflow.sdk import BaseOperatorLink, conf

from airflow_quota.plugins import URL_PREFIX

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey

XCOM_JOB_ID = "quota_job_id"
"""The XCom key under which ``QuotaTrainingOperator`` pushes its quota job's id."""


def job_page_url(job_id: int, base_url: str | None = None) -> str:
    """The job's page on the api-server: ``[api] base_url`` + ``/quota/jobs/<id>``."""
    base = base_url if base_url is not None else conf.get("api", "base_url", fallback="/")
    return f"{(base or '/').rstrip('/')}{URL_PREFIX}/jobs/{job_id}"


class QuotaJobLink(BaseOperatorLink):
    """Link a ``QuotaTrainingOperator`` task instance to its quota job's page."""

    name = "Quota job"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        job_id: Any = getattr(operator, "job_id", None)
        if job_id is None:
            job_id = _pushed_job_id(ti_key)
        return "" if job_id is None else job_page_url(int(job_id))


def _pushed_job_id(ti_key: TaskInstanceKey) -> Any:
    """The job id this task instance pushed to XCom, or None (not submitted yet)."""
    from airflow.sdk.execution_time.xcom import XCom

    try:
        return XCom.get_value(ti_key=ti_key, key=XCOM_JOB_ID)
    except ImportError:  # outside a task there is no task runner to ask: no link rather than an error
        return None


class SageMakerTrainingJobLink(BaseAwsLink):
    """The SageMaker console's page of the task's training job (its last attempt)."""

    name = "SageMaker training job"
    key = "quota_sagemaker_training_job"
    format_str = BASE_AWS_CONSOLE_LINK + "/sagemaker/home?region={region_name}#/jobs/{job_name}"


class TrainingLogsLink(BaseAwsLink):
    """The training job's CloudWatch log streams (``/aws/sagemaker/TrainingJobs``, the streams
    named after the job)."""

    name = "Training logs"
    key = "quota_sagemaker_training_logs"
    format_str = (
        BASE_AWS_CONSOLE_LINK + "/cloudwatch/home?region={region_name}#logsV2:log-groups/log-group/"
        "$252Faws$252Fsagemaker$252FTrainingJobs$3FlogStreamNameFilter$3D{job_name}"
    )
