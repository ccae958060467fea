"""The Celery workers' side of ``[quota] executor_delegate = celery``: each task's placement in
its environment, and the preemption signal.

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

It also registers the remote-control command ``SIGNAL_COMMAND``, which ``QuotaExecutor``
broadcasts when the quota scheduler preempts a task running on a worker: the worker holding the
try's task process sends it SIGTERM, so the share's ``preemption_grace_seconds`` run from then,
as on the local path; the executor stops the try through Airflow's RESTARTING route when the grace
is over. The command runs in the worker's main process (Celery's consumer) and finds the task's
process among the worker's descendants by the title the Task SDK gives it, ``airflow worker --
<task instance id>``: a task instance id names one try, so a late or repeated command cannot
reach another try or another task (Celery's own ``revoke(terminate=True)`` signals the pool
process by its pid, which the Celery documentation warns may by then run another task).

Kept light on purpose: every worker imports it at start.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterable, Mapping
from typing import Any

import psutil
from celery.signals import task_postrun, task_prerun
from celery.worker.control import control_command

from airflow_quota.executors.placement import VARIABLES

PLACEMENT_HEADER = "airflow_quota_placement"
"""The Celery message header that carries a task's placement (``celery_delegate`` sends it)."""

SIGNAL_COMMAND = "airflow_quota_signal_task"
"""The remote-control command that signals a try's task process (``signal_task``)."""
TASK_TITLE = ("airflow", "worker", "--")
"""The Task SDK's title of a task's process, before the task instance id (``task_runner.startup``)."""
SIGNALS = {"SIGTERM": signal.SIGTERM}
"""What the command may send: only the preemption's SIGTERM (the kill is Airflow's, by RESTARTING)."""
REMEMBER_SECONDS = 24 * 3600.0
"""How long a worker remembers a try it signalled, so a repeated command does not signal it twice."""

log = logging.getLogger(__name__)

_saved: dict[str, dict[str, str | None]] = {}
"""Per running Celery task id: the worker's own values of the names its placement set."""
_signalled: dict[str, float] = {}
"""Per task instance id this worker signalled: when (monotonic)."""


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


def task_processes(ti_id: str, processes: Iterable[psutil.Process]) -> list[psutil.Process]:
    """Among ``processes``, the task process of the try ``ti_id``: titled ``airflow worker -- <ti
    id>`` by the Task SDK, its parent not (a process the task forks, a data loader's worker,
    inherits the title; the task's own SIGTERM handler is the one to run, as on the local path).
    Processes gone or unreadable meanwhile are left out."""
    titled: dict[int, psutil.Process] = {}
    parents: dict[int, int] = {}
    for process in processes:
        try:
            title = " ".join(process.cmdline()).split()
            if tuple(title[:3]) == TASK_TITLE and title[3:4] == [ti_id]:
                titled[process.pid], parents[process.pid] = process, process.ppid()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return [process for pid, process in titled.items() if parents[pid] not in titled]


def signal_task(state: Any, ti_id: str = "", signal_name: str = "SIGTERM", **_: Any) -> dict[str, str]:
    """Send a try's task process SIGTERM when this worker runs it (once per try); the reply says
    what was done. Run by Celery's consumer for ``QuotaExecutor``'s broadcast (every worker gets
    it; those without the try do nothing)."""
    signum = SIGNALS.get(signal_name)
    if signum is None or not ti_id:
        wanted = f"a task instance id and one of {', '.join(SIGNALS)}"
        return {"error": f"{SIGNAL_COMMAND}: {wanted}, not {ti_id!r} {signal_name!r}"}
    now = time.monotonic()
    for old in [t for t, at in _signalled.items() if now - at > REMEMBER_SECONDS]:
        del _signalled[old]
    if ti_id in _signalled:
        return {"ok": f"task instance {ti_id} already signalled"}
    targets = task_processes(ti_id, psutil.Process().children(recursive=True))
    sent = []
    for process in targets:
        try:
            process.send_signal(signum)  # psutil refuses a pid reused since it was read
        except psutil.NoSuchProcess:
            continue
        sent.append(process.pid)
    if not sent:
        return {"ok": f"task instance {ti_id} does not run here"}
    _signalled[ti_id] = now
    log.info("%s to the task process %s of task instance %s (preempted)", signal_name, sent, ti_id)
    return {"ok": f"{signal_name} to {sent}"}


# connected by the module's import (Celery's ``imports``); weak references suffice: the module keeps them
task_prerun.connect(set_placement)
task_postrun.connect(restore_environment)
# registered by the module's import too: the worker's consumer dispatches broadcasts from this registry
control_command(name=SIGNAL_COMMAND, args=[("ti_id", str), ("signal_name", str)], signature="<ti_id> [SIGTERM]")(
    signal_task
)
