"""The Airflow listener that writes a ``QuotaExecutor`` task's quota story into its own log.

``QuotaExecutorTaskLog``, a plugin of its own (the ``airflow.plugins`` entry point
``airflow_quota_executor``), registers this module as a listener. The Task SDK calls
``on_task_instance_running`` in the task's own process, once the try has started and before the
task runs (``task_runner._prepare``), so what it logs lands in the try's log as Airflow writes it.
A task released by ``QuotaExecutor`` has its placement in its environment
(``executors/placement.py``): for those, and only those, the listener reads the job's story from
the quota database and logs it, one line each (``executors/story.py``). Any other task, on any
executor, is left alone. A quota database that cannot be read costs one warning line, never the
try.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import structlog
from airflow.listeners import hookimpl
from airflow.plugins_manager import AirflowPlugin

log = structlog.get_logger(logger_name="airflow_quota.task")


@hookimpl
def on_task_instance_running(previous_state: Any, task_instance: Any) -> None:
    """Log the quota's lines of a try released by ``QuotaExecutor`` (nothing for other tries)."""
    from airflow_quota.executors.placement import Placement

    try:
        placement = Placement.current()
    except (LookupError, KeyError, ValueError):  # not a QuotaExecutor try (or not a whole placement)
        return
    try:
        from airflow.configuration import conf

        from airflow_quota.executors.story import story_so_far, waited_lines
        from airflow_quota.hooks.quota import QuotaHook

        conn_id = conf.get("quota", "quota_conn_id", fallback="quota_default") or "quota_default"
        lines = story_so_far(
            QuotaHook(conn_id), placement, waited_lines(os.environ), int(getattr(task_instance, "try_number", 0))
        )
    except Exception as exc:  # the story is for people: the try runs without it
        log.warning(f"quota job {placement.job_id}: its story could not be read from the quota database: {exc}")
        return
    for line in lines:
        log.info(line)


class QuotaExecutorTaskLog(AirflowPlugin):
    """Registers this module's listener: the quota's lines in a ``QuotaExecutor`` try's log. Apart
    from ``QuotaPlugin`` (the page), which sits below the executor and knows nothing of it."""

    name = "airflow_quota_executor"
    listeners: list[Any] = [sys.modules[__name__]]  # noqa: RUF012 - AirflowPlugin's API
