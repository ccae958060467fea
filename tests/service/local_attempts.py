"""Attempts of the local backend for the tests that drive it with real processes
(``test_local_backend``, ``test_stop_grace``, ``test_local_end_to_end``): the training script,
an attempt's description, and waiting for an attempt to end."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from airflow_quota.service.backends.base import AttemptReport, AttemptSpec
from airflow_quota.service.backends.local import LocalBackend
from tests.waiting import wait_for

TRAIN = Path(__file__).resolve().parents[2] / "dags" / "train_script.py"


def spec(
    command: str | list[str], job_id: int = 7, attempt: int = 1, *, checkpoint_uri: str | None = None, **fields: Any
) -> AttemptSpec:
    """An attempt of ``command`` on one ``ml.g5.xlarge`` (1 GPU) unless ``fields`` say otherwise."""
    training = {"command": command, **fields.pop("training", {})}
    values: dict[str, Any] = {"job_name": f"job-{job_id}", "share": "qs1", "instance_type": "ml.g5.xlarge"}
    values.update({"count": 1, "gpus": 1, **fields})
    return AttemptSpec(job_id=job_id, attempt=attempt, checkpoint_uri=checkpoint_uri, training=training, **values)


def train(*args: object) -> list[str]:
    """The command line of ``dags/train_script.py`` with ``args``."""
    return [sys.executable, str(TRAIN), *(str(a) for a in args)]


def wait_until_ended(backend: LocalBackend, attempt: AttemptSpec, timeout: float = 8.0) -> AttemptReport:
    """Poll ``attempt`` until it has ended; its last report. Fails after ``timeout`` seconds."""
    reports: list[AttemptReport] = []

    def ended() -> bool:
        reports.append(backend.poll(attempt))
        return reports[-1].status.ended

    wait_for(ended, timeout, f"attempt {attempt.key} to end (last report {reports[-1:]})")
    return reports[-1]
