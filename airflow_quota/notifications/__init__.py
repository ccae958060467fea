"""Notifiers for quota alerts (STARVING, PREEMPTED_REPEATEDLY, GUARANTEE_VIOLATED).

``alerts.notifiers`` in quota.yaml lists Airflow ``BaseNotifier`` classes by import path with
their arguments; the quota scheduler sends each new alert to each of them once, after the cycle
that raised it has committed. ``QuotaLogNotifier`` (one log line per alert) is the default.
"""

from airflow_quota.notifications.base import QuotaNotifier, alert_message
from airflow_quota.notifications.log import QuotaLogNotifier

__all__ = ["QuotaLogNotifier", "QuotaNotifier", "alert_message"]
