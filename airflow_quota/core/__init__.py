"""The quota model: configuration, jobs, the scheduling cycle, preemption, starvation, measures.

Pure: no I/O beyond reading the packaged catalogue, no clock, no Airflow, database or cloud
imports (an import-linter contract enforces it). Callers pass the time in.
"""
