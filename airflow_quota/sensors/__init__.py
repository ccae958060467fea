"""Airflow sensors of airflow-quota: a quota job reaching a final state, a share's capacity."""

from airflow_quota.sensors.quota import QuotaCapacitySensor, QuotaJobSensor

__all__ = ["QuotaCapacitySensor", "QuotaJobSensor"]
