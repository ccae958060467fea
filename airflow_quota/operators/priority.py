"""Priority overrides from a run's conf: raise (or lower) every training task of some runs.

Declare the override on the DAG, in one line::

    from airflow_quota.operators.priority import quota_priority_param

    with DAG("train_daily", schedule="@daily", params=quota_priority_param()):
        QuotaTrainingOperator(task_id="train", share="research", priority=10, ...)

Then a backfill (or a manual trigger with conf) overrides the priority of every
``QuotaTrainingOperator`` of those runs::

    airflow backfill create --dag-id train_daily --from-date 2026-01-01 --to-date 2026-01-07 \\
        --dag-run-conf '{"quota_priority": 9000}'

Airflow validates the conf against the declared ``Param`` (an integer 0-9999, or null for no
override) when the runs are created. A priority above the share's ``max_priority`` fails the
task with the quota's message; nothing is submitted.

Without the declaration the operator still reads ``quota_priority`` from the run's conf, but
Airflow does not check it and the trigger form does not offer it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from airflow.sdk import Context, Param

QUOTA_PRIORITY_PARAM = "quota_priority"
MAX_PRIORITY = 9999


def quota_priority_param(default: int | None = None) -> dict[str, Param]:
    """The DAG ``params`` entry declaring the override: ``DAG(..., params=quota_priority_param())``.

    :param default: the override when a run's conf gives none; ``None`` (the default) keeps
        each task's own ``priority``.
    """
    return {
        QUOTA_PRIORITY_PARAM: Param(
            default,
            type=["null", "integer"],
            minimum=0,
            maximum=MAX_PRIORITY,
            title="Quota priority override",
            description=(
                "Priority (0-9999) for every QuotaTrainingOperator task of this run, instead of each task's own; "
                "empty keeps theirs. Refused above the share's max_priority."
            ),
        )
    }


def priority_override(context: Context | Mapping[str, Any]) -> int | None:
    """The run's priority override, or ``None``.

    Read from ``params`` when the DAG declares ``quota_priority`` (Airflow has merged the run's
    conf into it and validated it), else from the run's conf. ``ValueError`` names the value
    and the rule when it is not an integer 0-9999.
    """
    params = context.get("params") or {}
    if QUOTA_PRIORITY_PARAM in params:
        value = params[QUOTA_PRIORITY_PARAM]
        where = "params"
    else:
        dag_run = context.get("dag_run")
        conf = getattr(dag_run, "conf", None) or {}
        value = conf.get(QUOTA_PRIORITY_PARAM)
        where = "the run's conf"
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{QUOTA_PRIORITY_PARAM} in {where} must be an integer 0-{MAX_PRIORITY}, got {value!r}")
    if not 0 <= value <= MAX_PRIORITY:
        raise ValueError(f"{QUOTA_PRIORITY_PARAM} in {where} must be between 0 and {MAX_PRIORITY}, got {value}")
    return value
