"""Airflow operators of airflow-quota: ``QuotaTrainingOperator`` and the priority override."""

from airflow_quota.operators.priority import QUOTA_PRIORITY_PARAM, priority_override, quota_priority_param
from airflow_quota.operators.training import QuotaTrainingOperator

__all__ = ["QUOTA_PRIORITY_PARAM", "QuotaTrainingOperator", "priority_override", "quota_priority_param"]
