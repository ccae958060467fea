"""The Celery workers' side of ``[quota] executor_delegate = celery``: each task's placement in
its environment.

``QuotaExecutor`` sends the placement (``AIRFLOW_QUOTA_*``) in the Celery message's header
(``executors/celery_delegate.py``). Each ``airflow celery worker`` loads this module through
Celery's ``imports`` setting::

    [celery]
    extra_celery_config = {"imports": ["airflow_quota.executors.celery_worker"]}

Then, around each task, Celery's ``task_prerun`` and ``task_postrun`` signals set the placement in
the pool process's environment and restore it, as LocalExecutor's worker does
(``executors/worker.py``): the Task SDK's supervisor runs in that process and the task's process
it forks inherits the placement. Only the ``AIRFLOW_QUOTA_*`` names are taken from a header, so
a message cannot set anything else (``PATH``, ``LD_PRELOAD``) on the worker.

Kept light on purpose: every worker imports it at start.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from celery.signals import task_postrun, task_prerun

from airflow_quota.executors.placement import VARIABLES

PLACEMENT_HEADER = "airflow_quota_placement"
"""The Celery message header that carries a task's placement (``celery_delegate`` sends it)."""

_saved: dict[str, dict[str, str | None]] = {}
"""Per running Celery task id: the worker's own values of the names its placement set."""


def placement_of(request: Any) -> dict[str, str]:
    """The placement environment a Celery task's message carries, restricted to ``VARIABLES``;
    empty for a task ``QuotaExecutor`` did not send."""
    headers = getattr(request, "headers", None) or {}
    carried = headers.get(PLACEMENT_HEADER) or getattr(request, PLACEMENT_HEADER, None)
    if not isinstance(carried, Mapping):
        return {}
    return {name: str(carried[name]) for name in VARIABLES if name in carried}


def set_placement(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    """Before the task runs: its placement into this process's environment."""
    environment = placement_of(getattr(task, "request", None))
    if not environment or task_id is None:
        return
    _saved[task_id] = {name: os.environ.get(name) for name in VARIABLES}
    for name in VARIABLES:  # a name this placement lacks must not leak from the worker's own
        os.environ.pop(name, None)
    os.environ.update(environment)


def restore_environment(task_id: str | None = None, **_: Any) -> None:
    """After the task: the worker's environment as it was."""
    saved = _saved.pop(task_id, None) if task_id is not None else None
    if saved is None:
        return
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# connected by the module's import (Celery's ``imports``); weak references suffice: the module keeps them
task_prerun.connect(set_placement)
task_postrun.connect(restore_environment)
