"""What Airflow hands an operator's ``execute``, for the tests that run the quota operator
without Airflow running it (``test_operators``, ``test_sensors``, ``test_sagemaker_operator``):
a task instance with the fields the operator reads, its context, and the deferral it raises."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

import pytest
from airflow.sdk import Context
from airflow.sdk.exceptions import TaskDeferred

from airflow_quota.operators.training import QuotaTrainingOperator
from airflow_quota.triggers.quota import QuotaJobTrigger

RUN_ID = "scheduled__2026-01-01T00:00:00+00:00"


@dataclass
class TaskInstance:
    """The few task-instance fields the operator reads, and the XComs it pushes."""

    dag_id: str = "train_daily"
    task_id: str = "train"
    run_id: str = RUN_ID
    map_index: int = -1
    try_number: int = 1
    xcoms: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


@dataclass
class DagRun:
    conf: dict[str, Any] = field(default_factory=dict)


def context(
    ti: TaskInstance | None = None, conf: dict[str, Any] | None = None, params: dict[str, Any] | None = None
) -> Context:
    """The context of a task instance (by default ``TaskInstance()``), its run's conf and params."""
    return cast(Context, {"ti": ti or TaskInstance(), "dag_run": DagRun(conf or {}), "params": params or {}})


def deferred(op: QuotaTrainingOperator, ctx: Context) -> QuotaJobTrigger:
    """The trigger ``op`` defers to when it executes in ``ctx`` (it must defer)."""
    with pytest.raises(TaskDeferred) as deferral:
        op.execute(ctx)
    assert deferral.value.method_name == "execute_complete"
    trigger = deferral.value.trigger
    assert isinstance(trigger, QuotaJobTrigger)
    return trigger
