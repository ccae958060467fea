"""The default notifier: one readable line per alert in the quota scheduler's log."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from airflow_quota.notifications.base import QuotaNotifier

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


class QuotaLogNotifier(QuotaNotifier):
    """Write each alert as one line on the ``airflow_quota.alerts`` logger.

    What the quota scheduler does with its alerts when ``alerts.notifiers`` is empty, and what
    it falls back to when none of the configured notifiers can be built. Needs no Airflow.

    :param level: the log level of the lines (default ``WARNING``: an alert is worth a look).
    :param logger: the logger's name.
    """

    def __init__(self, *, level: str = "WARNING", logger: str = "airflow_quota.alerts") -> None:
        if level.upper() not in LEVELS:
            raise ValueError(f"level {level!r} is not one of {', '.join(LEVELS)}")
        self.level = logging.getLevelName(level.upper())
        self.log = logging.getLogger(logger)

    def notify(self, context: Mapping[str, Any]) -> None:
        """``quota alert STARVING: job 7 (train-a) in share research: RUNNABLE for 3600 s, position 1 in its share``"""
        self.log.log(self.level, "%s", context["alert"]["message"])
