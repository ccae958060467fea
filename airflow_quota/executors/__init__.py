"""``QuotaExecutor``: any Airflow task held QUEUED until its quota share places it.

``[core] executor = LocalExecutor,quota:airflow_quota.executors.QuotaExecutor``, then
``executor="quota"`` and ``executor_config=quota_config(...)`` on a task. Every name is loaded
on first use: Airflow imports ``airflow_quota.executors.policy`` (its ``airflow.policy`` entry
point) while it initialises itself, so this package imports nothing at import time, and the
DAG-side helpers (``quota_config``, ``Placement``, ``on_preemption``) never load the executor.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_WHERE = {
    "QuotaExecutor": "airflow_quota.executors.quota_executor",
    "quota_config": "airflow_quota.executors.config",
    "Placement": "airflow_quota.executors.placement",
    "on_preemption": "airflow_quota.executors.placement",
}
__all__ = ["Placement", "QuotaExecutor", "on_preemption", "quota_config"]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
