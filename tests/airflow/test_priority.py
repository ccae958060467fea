"""The priority override: the DAG Param it declares, and reading it from a run's context."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from airflow.sdk.definitions.param import ParamsDict
from airflow.sdk.exceptions import ParamValidationError

from airflow_quota.operators.priority import QUOTA_PRIORITY_PARAM, priority_override, quota_priority_param


def test_the_param_is_an_optional_integer_0_to_9999() -> None:
    params = ParamsDict(quota_priority_param())
    assert params.validate() == {"quota_priority": None}
    params["quota_priority"] = 9000
    assert params.validate() == {"quota_priority": 9000}
    for bad in (10000, -1, "high"):
        with pytest.raises(ParamValidationError):
            params["quota_priority"] = bad
    described = quota_priority_param(7)[QUOTA_PRIORITY_PARAM]
    assert described.value == 7 and "max_priority" in (described.description or "")


@pytest.mark.parametrize(
    ("context", "priority"),
    [
        ({}, None),
        ({"params": {}, "dag_run": SimpleNamespace(conf={})}, None),
        ({"params": {}, "dag_run": SimpleNamespace(conf={"quota_priority": 9000})}, 9000),
        ({"params": {}, "dag_run": SimpleNamespace(conf=None)}, None),
        ({"params": {"quota_priority": 12}, "dag_run": SimpleNamespace(conf={"quota_priority": 9000})}, 12),
        ({"params": {"quota_priority": None}, "dag_run": SimpleNamespace(conf={"quota_priority": 9000})}, None),
        ({"params": ParamsDict(quota_priority_param(0))}, 0),
    ],
    ids=[
        "no params, no run",
        "an empty conf",
        "an undeclared override in the conf",
        "a run without conf",
        "a declared Param is what Airflow merged and validated",
        "a declared Param left empty means no override",
        "a declared default of 0 is an override, not nothing",
    ],
)
def test_priority_override(context: dict[str, Any], priority: int | None) -> None:
    assert priority_override(context) == priority


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("9000", "quota_priority in the run's conf must be an integer 0-9999, got '9000'"),
        (True, "quota_priority in the run's conf must be an integer 0-9999, got True"),
        (12000, "quota_priority in the run's conf must be between 0 and 9999, got 12000"),
    ],
    ids=["a string", "a boolean", "above 9999"],
)
def test_an_undeclared_bad_override_is_refused_naming_it(value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        priority_override({"dag_run": SimpleNamespace(conf={"quota_priority": value})})
