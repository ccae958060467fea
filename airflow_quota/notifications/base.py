"""What every quota notifier is given, and the notifiers that need no Airflow.

The quota scheduler sends each alert to the notifiers of ``alerts.notifiers``: Airflow
``BaseNotifier`` classes (``airflow.sdk``; the amazon provider's ``SnsNotifier`` and the like)
when Airflow is installed where the scheduler runs, and ``QuotaNotifier`` subclasses, which
need nothing but this package (``QuotaLogNotifier`` is one, and the default).

Every notifier gets one context mapping per alert, the same for both kinds::

    {"alert": {"id": 3, "kind": "STARVING", "job_id": 7, "job_name": "train-a",
               "share": "research", "reason": "RUNNABLE for 3600 s", "age_seconds": 3600.0,
               "position": 1, "at": "2026-11-29T09:17:20+00:00", "timestamp": 1795943840.0,
               "message": "quota alert STARVING: job 7 (train-a) in share research: ...",
               "dag_id": "train", "task_id": "fit", "run_id": "manual__..."}}

Everything sits under ``alert`` because a ``BaseNotifier`` merges its own templated fields into
the context before rendering (``SnsNotifier``'s ``message`` would shadow a top-level
``message``), so templates say ``{{ alert.message }}``, ``{{ alert.kind }}``.
"""

from __future__ import annotations

import logging
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, redirect_stdout
from typing import Any


class QuotaNotifier(ABC):
    """A notifier that needs no Airflow: called with the alert's context, sends it somewhere.

    Subclass it for a channel of your own that must work where Airflow is not installed; where
    it is, an Airflow ``BaseNotifier`` works as well and brings templated fields.
    """

    def __call__(self, context: Mapping[str, Any]) -> None:
        self.notify(context)

    @abstractmethod
    def notify(self, context: Mapping[str, Any]) -> None:
        """Send one alert; raise when it could not be sent (the scheduler retries later)."""


def airflow_base_notifier() -> type | None:
    """Airflow's ``BaseNotifier`` class, or None when Airflow cannot be imported here."""
    try:
        with keeping_logging():
            from airflow.sdk import BaseNotifier
    except ImportError:
        return None
    return BaseNotifier


@contextmanager
def keeping_logging() -> Iterator[None]:
    """Keep the process's logging as it is across the first import of Airflow.

    ``import airflow`` configures logging for an Airflow process: structlog on standard output,
    the root logger's handlers and level replaced. The quota scheduler and the command line are
    not Airflow processes: the scheduler's decision lines keep their format and stream, and a
    command's standard output (a table, ``--json``) gets nothing from Airflow. What Airflow logs
    while it loads goes to standard error. Once Airflow is loaded this does nothing.
    """
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    try:
        with redirect_stdout(sys.stderr):
            yield
    finally:
        if root.handlers != handlers:
            root.handlers[:] = handlers
            root.setLevel(level)


def alert_message(kind: str, job_id: int | None, job: str, share: str, reason: str, position: int | None = None) -> str:
    """The one line that tells an alert, in the scheduler's log, notifications and task logs:
    ``quota alert STARVING: job 7 (train-a) in share research: RUNNABLE for 3600 s, position 1
    in its share``."""
    who = f"job {job_id} ({job})" if job_id is not None else f"job {job}"
    where = f", position {position} in its share" if position else ""
    return f"quota alert {kind}: {who} in share {share}: {reason}{where}"
