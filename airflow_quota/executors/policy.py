"""The parse-time check of ``QuotaExecutor``'s tasks: a cluster policy (``task_policy``).

Registered through the ``airflow.policy`` entry point, so the DAG processor runs it on every task
of every DAG it parses. A task of the quota executor whose ``executor_config["quota"]`` breaks a
rule, or a task that sets ``executor_config["quota"]`` but runs on another executor (it would
never be under the shares), makes its DAG an import error naming the field
(``AirflowClusterPolicyViolation``), before anything is queued. Values Airflow only knows at run
time (Jinja) are checked when the executor takes the task.
"""

from __future__ import annotations

from typing import Any

from airflow.exceptions import AirflowClusterPolicyViolation
from airflow.policies import hookimpl

CLASS_NAME = "QuotaExecutor"
MODULE_PATH = "airflow_quota.executors.QuotaExecutor"
NAMES = ("quota", CLASS_NAME, MODULE_PATH, "airflow_quota.executors.quota_executor.QuotaExecutor")
"""The documented alias, the class name and its paths."""


def is_quota_executor(executor: str | None) -> bool:
    """Whether a task's ``executor`` names ``QuotaExecutor``: the documented alias ``quota``, its
    class name or path, or another alias ``[core] executor`` gives it."""
    if not executor:
        return False
    if executor in NAMES:
        return True
    try:
        from airflow.executors.executor_loader import ExecutorLoader

        name = ExecutorLoader.lookup_executor_name_by_str(executor)
    except Exception:  # not configured here: Airflow refuses the DAG for that itself
        return False
    return str(name.module_path).endswith(CLASS_NAME)


@hookimpl
def task_policy(task: Any) -> None:
    """Refuse a quota task whose config breaks a rule, naming the field."""
    # imported here: Airflow loads this module while it initialises, before the Task SDK is ready
    from airflow_quota.executors.config import QUOTA_KEY, config_problems

    config = getattr(task, "executor_config", None) or {}
    quota_task = is_quota_executor(getattr(task, "executor", None))
    if not quota_task:
        if isinstance(config, dict) and QUOTA_KEY in config:
            raise AirflowClusterPolicyViolation(
                f"task {task.task_id!r}: executor_config.{QUOTA_KEY} is set but the task runs on "
                f"executor {getattr(task, 'executor', None)!r}; give it executor='quota' to put it under the shares"
            )
        return
    problems = config_problems(config, getattr(task, "queue", None), parse_time=True)
    if problems:
        raise AirflowClusterPolicyViolation(
            f"task {task.task_id!r}: invalid quota executor_config: " + "; ".join(str(p) for p in problems)
        )
