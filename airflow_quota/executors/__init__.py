"""``QuotaExecutor``: any Airflow task held QUEUED until its quota share places it.

``[core] executor = LocalExecutor,quota:airflow_quota.executors.QuotaExecutor``, then
``executor="quota"`` and ``executor_config=quota_config(...)`` on a task. The executor is loaded
lazily, so the DAG-side helpers (``quota_config``, ``Placement``, ``on_preemption``) import
nothing of Airflow's executors.
"""

from __future__ import annotations

from typing import Any

from airflow_quota.executors.config import quota_config
from airflow_quota.executors.placement import Placement, on_preemption

__all__ = ["Placement", "QuotaExecutor", "on_preemption", "quota_config"]


def __getattr__(name: str) -> Any:
    if name == "QuotaExecutor":
        from airflow_quota.executors.quota_executor import QuotaExecutor

        return QuotaExecutor
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
