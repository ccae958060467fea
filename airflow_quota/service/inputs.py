"""The inputs of the core as stored in ``quota_inputs``, and applying one to a scheduler.

The live scheduler and a recovering one go through ``apply_input`` alike, so replaying the log
rebuilds exactly the state the last leader had (the core is deterministic).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow_quota.core.config import QuotaConfig
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.model import Decision, JobRequest

KINDS = ("config", "submit", "set_priority", "cancel", "running", "finished", "stopped", "capacity_error", "cycle")


def apply_input(
    scheduler: QuotaScheduler | None, kind: str, payload: dict[str, Any], at: float
) -> tuple[QuotaScheduler | None, list[Decision]]:
    """Feed one input to the core; returns the scheduler (created by the first configuration)
    and the decisions. Raises the core's Refused errors for requests it refuses."""
    if kind == "config":
        config = QuotaConfig.model_validate(payload["document"])
        if scheduler is None:
            return QuotaScheduler(config), []
        return scheduler, scheduler.apply_config(config, at)
    if scheduler is None:
        raise LookupError("no quota configuration has been applied yet")
    if kind == "submit":
        request = JobRequest.model_validate(payload["request"])
        return scheduler, scheduler.submit(request, at, ref=int(payload["job_id"]))
    if kind == "cycle":
        return scheduler, scheduler.run_cycle(at)
    job = scheduler.by_ref(int(payload["job_id"]))
    if kind == "set_priority":
        return scheduler, scheduler.set_priority(job, int(payload["priority"]), at)
    if kind == "cancel":
        return scheduler, scheduler.cancel(job, at)
    if kind == "running":
        scheduler.job_running(job, float(payload.get("since", at)))
        return scheduler, []
    if kind == "finished":
        return scheduler, scheduler.job_finished(job, at, bool(payload["succeeded"]), str(payload.get("reason") or ""))
    if kind == "stopped":
        return scheduler, scheduler.victim_stopped(job, at)
    if kind == "capacity_error":
        return scheduler, scheduler.capacity_error(job, at, float(payload["backoff"]))
    raise ValueError(f"unknown input kind {kind!r}")


def replay(inputs: Iterable[tuple[str, dict[str, Any], float]]) -> QuotaScheduler | None:
    """Rebuild a scheduler from its input log; refused requests are refused again, silently."""
    from airflow_quota.exceptions import Refused

    scheduler: QuotaScheduler | None = None
    for kind, payload, at in inputs:
        try:
            scheduler, _ = apply_input(scheduler, kind, payload, at)
        except Refused:
            continue
    return scheduler
