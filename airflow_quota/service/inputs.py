"""The core's inputs (``core.inputs``) as rows of ``quota_inputs``, and applying one to a scheduler.

The live scheduler and a recovering one go through ``apply`` alike, so replaying the log rebuilds
exactly the state the last leader had (the core is deterministic). A row is a ``kind`` and a JSON
``payload``; the kinds and payloads are the log's stable format (older logs replay unchanged).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from airflow_quota.core.config import stored_config
from airflow_quota.core.cycle import QuotaScheduler
from airflow_quota.core.inputs import (
    AttemptFailed,
    AttemptRunning,
    AttemptStopped,
    AttemptSucceeded,
    CapacityErrorReported,
    ConfigurationApplied,
    CycleDue,
    Input,
    JobCancelled,
    JobSubmitted,
    PrioritySet,
    ProviderAvailability,
    handle,
)
from airflow_quota.core.model import Decision, JobRequest, Rejected

KINDS = (
    "config",
    "submit",
    "set_priority",
    "cancel",
    "running",
    "finished",
    "stopped",
    "capacity_error",
    "provider",
    "cycle",
)


def from_row(kind: str, payload: dict[str, Any]) -> Input:
    """The typed input a log row (or a request of the inbox, in the same shape) stands for."""
    if kind == "config":
        return ConfigurationApplied(stored_config(payload["document"]), payload.get("version"))
    if kind == "cycle":
        return CycleDue()
    if kind == "provider":
        available = payload["available"]
        return ProviderAvailability(str(payload["instance_type"]), None if available is None else int(available))
    ref = int(payload["job_id"])
    if kind == "submit":
        return JobSubmitted(ref, JobRequest.model_validate(payload["request"]))
    if kind == "set_priority":
        return PrioritySet(ref, int(payload["priority"]))
    if kind == "cancel":
        return JobCancelled(ref)
    attempt = int(payload.get("attempt", 0))
    if kind == "running":
        return AttemptRunning(ref, attempt, float(payload["since"]))
    if kind == "finished" and payload["succeeded"]:
        return AttemptSucceeded(ref, attempt)
    if kind == "finished":
        return AttemptFailed(ref, attempt, str(payload.get("reason") or ""))
    if kind == "stopped":
        return AttemptStopped(ref, attempt)
    if kind == "capacity_error":
        return CapacityErrorReported(ref, attempt, float(payload["backoff"]))
    raise ValueError(f"kind: unknown input kind {kind!r} (one of {', '.join(KINDS)})")


def to_row(item: Input) -> tuple[str, dict[str, Any]]:
    """The log row of a typed input: ``from_row(*to_row(item)) == item``."""
    match item:
        case ConfigurationApplied(config, version):
            return "config", {"document": config.model_dump(mode="json"), "version": version}
        case CycleDue():
            return "cycle", {}
        case ProviderAvailability(instance_type, available):
            return "provider", {"instance_type": instance_type, "available": available}
        case JobSubmitted(ref, request):
            return "submit", {"job_id": ref, "request": request.model_dump(mode="json")}
        case PrioritySet(ref, priority):
            return "set_priority", {"job_id": ref, "priority": priority}
        case JobCancelled(ref):
            return "cancel", {"job_id": ref}
        case AttemptRunning(ref, attempt, since):
            return "running", {"job_id": ref, "attempt": attempt, "since": since}
        case AttemptSucceeded(ref, attempt):
            return "finished", {"job_id": ref, "attempt": attempt, "succeeded": True}
        case AttemptFailed(ref, attempt, reason):
            return "finished", {"job_id": ref, "attempt": attempt, "succeeded": False, "reason": reason}
        case AttemptStopped(ref, attempt):
            return "stopped", {"job_id": ref, "attempt": attempt}
        case CapacityErrorReported(ref, attempt, backoff_seconds):
            return "capacity_error", {"job_id": ref, "attempt": attempt, "backoff": backoff_seconds}
    raise TypeError(f"not an input of the core: {item!r}")


def apply(scheduler: QuotaScheduler | None, item: Input, at: float) -> tuple[QuotaScheduler | None, list[Decision]]:
    """Handle one input; returns the scheduler (created by the first configuration) and the
    decisions (a refusal is one ``Rejected``). Before the first configuration nothing else can
    be taken in."""
    if scheduler is None:
        if isinstance(item, ConfigurationApplied):
            return QuotaScheduler(item.config), []
        raise LookupError("no quota configuration has been applied yet")
    return scheduler, handle(scheduler, item, at)


def refusal(decisions: list[Decision]) -> Rejected | None:
    """The ``Rejected`` decision of a refused input, or None when it was taken in."""
    if len(decisions) == 1 and isinstance(decisions[0], Rejected):
        return decisions[0]
    return None


def replay(rows: Iterable[tuple[str, dict[str, Any], float]]) -> QuotaScheduler | None:
    """Rebuild a scheduler from its input log; refused inputs are refused again, silently."""
    return replay_onto(None, rows)


def replay_known(scheduler: QuotaScheduler, rows: Iterable[tuple[str, dict[str, Any], float]]) -> None:
    """``replay_onto``, skipping each input that names a job ``scheduler`` has forgotten: a
    finished job, about which every input is refused or changes nothing."""
    for kind, payload, at in rows:
        ref = payload.get("job_id")
        if kind != "submit" and ref is not None and ref not in scheduler.state.refs:
            continue
        apply(scheduler, from_row(kind, payload), at)


def replay_onto(
    scheduler: QuotaScheduler | None, rows: Iterable[tuple[str, dict[str, Any], float]]
) -> QuotaScheduler | None:
    """Feed a part of the input log to ``scheduler`` (a snapshot's, or None at the log's start)."""
    for kind, payload, at in rows:
        scheduler, _ = apply(scheduler, from_row(kind, payload), at)
    return scheduler
