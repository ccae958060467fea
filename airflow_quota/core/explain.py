"""Decisions rendered for people and files: one readable line for logs, and the event record
of docs/simulate.md (also kept in the quota database's decision log)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from airflow_quota.core.model import (
    Alert,
    Decision,
    Failed,
    Placed,
    Preempted,
    PriorityChanged,
    Rejected,
    Requeued,
    Submitted,
    Succeeded,
)


def instant(epoch_seconds: float) -> str:
    """An instant as the decision log writes it on the wall clock: ``2026-12-01T14:20:05+00:00``."""
    return datetime.fromtimestamp(epoch_seconds, tz=timezone.utc).isoformat(timespec="seconds")


def describe(decision: Decision, wall_clock: bool = False) -> str:
    """``t=600 PREEMPTED qs1-med [qs1] CROSS_SHARE by qs2-job, lost 0 s: <why>``; with
    ``wall_clock`` the time is an ISO instant (``instant``: the service's clock is epoch seconds)."""
    head = instant(decision.at) if wall_clock else f"t={decision.at:g}"
    who = f"{decision.job} [{decision.share}]"
    if isinstance(decision, Submitted):
        return f"{head} SUBMITTED {who}"
    if isinstance(decision, Rejected):
        return f"{head} REJECTED {decision.request} of {who}: {decision.error}"
    if isinstance(decision, Placed):
        return f"{head} PLACED {who} on {decision.entry}, attempt {decision.attempt}: {decision.reason}"
    if isinstance(decision, Preempted):
        return (
            f"{head} PREEMPTED {who} {decision.kind.value} by {decision.by}, lost {decision.lost_seconds:g} s, "
            f"grace {decision.grace_seconds:g} s: {decision.reason}"
        )
    if isinstance(decision, Requeued):
        return f"{head} REQUEUED {who} after a failed attempt: {decision.reason}"
    if isinstance(decision, Succeeded):
        return f"{head} SUCCEEDED {who}"
    if isinstance(decision, Failed):
        return f"{head} FAILED {who} {decision.reason.value}: {decision.detail}"
    if isinstance(decision, PriorityChanged):
        return f"{head} PRIORITY_CHANGED {who} {decision.old} -> {decision.new}"
    if isinstance(decision, Alert):
        where = f", position {decision.position} in its share" if decision.position else ""
        return f"{head} ALERT {decision.kind.value} {who}: {decision.reason}{where}"
    return f"{head} {type(decision).__name__} {who}"


def number(value: float, digits: int = 6) -> float | int:
    """Integral values print as integers, others rounded: stable, readable JSON."""
    rounded = round(value, digits)
    return int(rounded) if rounded == int(rounded) else rounded


def event_record(decision: Decision) -> dict[str, Any]:
    record: dict[str, Any] = {"t": number(decision.at), "type": "", "job": decision.job, "share": decision.share}
    if isinstance(decision, Submitted):
        record["type"] = "SUBMITTED"
    elif isinstance(decision, Rejected):
        record.update(type="REJECTED", error=decision.error)
        if decision.request != "submit":
            record["request"] = decision.request
    elif isinstance(decision, Placed):
        record.update(
            type="PLACED",
            instance_type=decision.entry.instance_type,
            count=decision.entry.count,
            borrowed=decision.borrowed,
            training_plan=decision.entry.training_plan,
            attempt=decision.attempt,
            reason=decision.reason,
        )
    elif isinstance(decision, Preempted):
        record.update(
            type="PREEMPTED",
            kind=decision.kind.value,
            by=decision.by,
            lost_seconds=number(decision.lost_seconds),
            grace_seconds=number(decision.grace_seconds),
            reason=decision.reason,
        )
    elif isinstance(decision, Requeued):
        record.update(type="REQUEUED", reason=decision.reason)
    elif isinstance(decision, Succeeded):
        record["type"] = "SUCCEEDED"
    elif isinstance(decision, Failed):
        record.update(type="FAILED", reason=decision.reason.value, detail=decision.detail)
    elif isinstance(decision, PriorityChanged):
        record.update(type="PRIORITY_CHANGED", priority=decision.new, previous=decision.old)
    elif isinstance(decision, Alert):
        record.update(type="ALERT", kind=decision.kind.value, reason=decision.reason, position=decision.position)
        if decision.age_seconds is not None:
            record["age_seconds"] = number(decision.age_seconds)
        if decision.overtaken_by is not None:
            record["overtaken_by"] = decision.overtaken_by
    return record
