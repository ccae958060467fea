"""Airflow hooks of airflow-quota: ``QuotaHook`` reaches the quota database."""

from airflow_quota.hooks.quota import CapacityCheck, QuotaHook

__all__ = ["CapacityCheck", "QuotaHook"]
