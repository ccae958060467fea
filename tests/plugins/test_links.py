"""The "Quota job" link of ``QuotaTrainingOperator`` task instances."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="airflow-quota-plugin-tests-"))

import pytest
from airflow.models.taskinstancekey import TaskInstanceKey
from airflow.sdk import DAG
from airflow.serialization.serialized_objects import OperatorSerialization

from airflow_quota.operators.training import QuotaTrainingOperator
from airflow_quota.plugins.links import QuotaJobLink, job_page_url

KEY = TaskInstanceKey("train_daily", "train", "manual__1", 1, -1)


def operator() -> QuotaTrainingOperator:
    with DAG("train_daily", schedule=None):
        return QuotaTrainingOperator(
            task_id="train",
            share="qs1",
            instance_preferences=[{"instance_type": "ml.g5.xlarge", "count": 1}],
            command="python train.py",
        )


@pytest.mark.parametrize(
    ("base_url", "expected"),
    [
        ("http://airflow.example:8080", "http://airflow.example:8080/quota/jobs/7"),
        ("https://example.org/airflow/", "https://example.org/airflow/quota/jobs/7"),
        ("/", "/quota/jobs/7"),
    ],
    ids=["host", "host and path", "relative"],
)
def test_the_job_page_is_under_the_api_base_url(base_url: str, expected: str) -> None:
    assert job_page_url(7, base_url) == expected


def test_the_operator_declares_the_link_and_airflow_serializes_it() -> None:
    """Airflow 3 keeps the link in XCom under this key; the UI reads it from there."""
    serialized = OperatorSerialization.serialize_operator(operator())
    assert serialized["_operator_extra_links"] == {
        "Quota job": "_link_QuotaJobLink",
        "SageMaker training job": "_link_SageMakerTrainingJobLink",
        "Training logs": "_link_TrainingLogsLink",
    }


def test_the_link_leads_to_the_job_the_task_submitted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://airflow.example:8080")
    task = operator()
    task.job_id = 7  # set by execute() once submitted, and by execute_complete() on resuming
    assert QuotaJobLink().get_link(task, ti_key=KEY) == "http://airflow.example:8080/quota/jobs/7"


def test_outside_a_task_there_is_no_xcom_to_read_and_no_link() -> None:
    assert QuotaJobLink().get_link(operator(), ti_key=KEY) == ""


@pytest.mark.parametrize(("pushed", "expected"), [(7, "/quota/jobs/7"), (None, "")], ids=["pushed", "not yet"])
def test_in_a_worker_the_link_reads_the_job_id_the_task_pushed(
    monkeypatch: pytest.MonkeyPatch, pushed: int | None, expected: str
) -> None:
    """In a worker (where Airflow computes links) a resumed operator has no ``job_id`` yet: the
    link reads the ``quota_job_id`` XCom of this task instance (the end-to-end test checks the
    link a real Airflow stores)."""
    from airflow.sdk.execution_time.xcom import XCom

    asked: list[tuple[TaskInstanceKey, str]] = []

    def get_value(*, ti_key: TaskInstanceKey, key: str) -> int | None:
        asked.append((ti_key, key))
        return pushed

    monkeypatch.setattr(XCom, "get_value", staticmethod(get_value))
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "/")
    assert QuotaJobLink().get_link(operator(), ti_key=KEY) == expected
    assert asked == [(KEY, "quota_job_id")]
