"""Airflow triggers of airflow-quota: follow a quota job, or wait for a share's capacity."""

from airflow_quota.triggers.quota import QuotaCapacityTrigger, QuotaJobEvent, QuotaJobTrigger

__all__ = ["QuotaCapacityTrigger", "QuotaJobEvent", "QuotaJobTrigger"]
