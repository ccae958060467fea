"""The input log a simulation feeds its core, in the quota service's format
(``service/inputs.py``): what the snapshot tests replay, cut and resume, and what the recovery
benchmark stores, without running the service."""

from __future__ import annotations

from typing import Any

from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.inputs import Input
from airflow_quota.core.model import Decision, JobRequest
from airflow_quota.service.inputs import to_row
from airflow_quota.sim.scenario import LoadedScenario
from airflow_quota.sim.simulator import Simulator

Row = tuple[str, dict[str, Any], float]
"""A log row: its kind, its payload, its instant."""


def input_log(loaded: LoadedScenario) -> list[Row]:
    """Every input the simulator feeds its core on the scenario, as the quota service logs
    them, to be fed to ``starting_core``."""
    rows: list[Row] = []

    class Recording(Simulator):
        def _handle(self, item: Input, now: float) -> list[Decision]:
            kind, payload = to_row(item)
            if kind == "submit":  # the simulator's job carries its duration too: not part of the log
                payload["request"] = {k: v for k, v in payload["request"].items() if k in JobRequest.model_fields}
            rows.append((kind, payload, now))
            return super()._handle(item, now)

    Recording(loaded).run()
    return rows


def starting_core(loaded: LoadedScenario) -> QuotaScheduler:
    """The core the simulator starts from, before the first row of ``input_log``."""
    return QuotaScheduler(loaded.config, origin=loaded.start)
