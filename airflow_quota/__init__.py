"""airflow-quota: quota shares, borrowing, preemption and instance preference lists for
GPU training run from Apache Airflow."""

__version__ = "0.1.0"
